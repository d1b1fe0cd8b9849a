"""pyproject.toml lists the packages the wheel ships by hand: a subpackage missing
from the list would import here (from the source tree) and be absent from the
wheel that pip, Pyodide and the web demo install."""
import os

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setuptools():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_package_folder_is_listed_and_every_listed_package_exists():
    config = _setuptools()
    on_disk = set()
    for package, folder in config["package-dir"].items():
        top = os.path.join(REPO, folder)
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = [p for p in os.path.relpath(root, top).split(os.sep) if p != "."]
            if "__init__.py" in files:
                on_disk.add(".".join([package] + rel))
            else:
                assert not any(f.endswith(".py") for f in files), f"{root}: Python files without an __init__.py"
    listed = set(config["packages"])
    assert on_disk - listed == set(), f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert listed - on_disk == set(), f"listed but not on disk: {sorted(listed - on_disk)}"
