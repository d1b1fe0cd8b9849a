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
            if "__init__.py" in files or (files and rel):  # a data-only folder imports as a namespace package
                on_disk.add(".".join([package] + rel))
            if "__init__.py" not in files:
                assert not any(f.endswith(".py") for f in files), f"{root}: Python files without an __init__.py"
    listed = set(config["packages"])
    assert on_disk - listed == set(), f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert listed - on_disk == set(), f"listed but not on disk: {sorted(listed - on_disk)}"


def _package_files():
    """(package, file name, path) of every file that is not Python in the package folders."""
    for package, folder in _setuptools()["package-dir"].items():
        top = os.path.join(REPO, folder)
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = [p for p in os.path.relpath(root, top).split(os.sep) if p != "."]
            for name in files:
                if not name.endswith((".py", ".pyc")):
                    yield ".".join([package] + rel), name, os.path.join(root, name)


def test_package_data_declares_every_file_that_is_not_python():
    """Each kernel source, header and marker file is declared in its own package's package-data
    (a file setuptools would find only through an ancestor's "sub/*.ext" pattern in an unlisted
    folder is what made `pip install -e .` print its "absent from the packages" warnings)."""
    import fnmatch
    config = _setuptools()
    data = config.get("package-data", {})
    undeclared = [path for package, name, path in _package_files()
                  if package not in config["packages"]
                  or not any(fnmatch.fnmatchcase(name, pattern) and "/" not in pattern for pattern in data.get(package, ()))]
    assert len(list(_package_files())) > 50  # the wgsl, kernels, h, metal and js files are all seen
    assert undeclared == [], f"declare in [tool.setuptools.package-data] (and packages): {undeclared}"
