"""Install and start-up are quiet (issue 29 item 4): building the wheel or the editable install
prints no setuptools warnings, the wheel still holds every kernel source, and `tallow devices`
does not pass on the Vulkan loader's "XDG_RUNTIME_DIR is invalid" lines."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARNING = re.compile(r"\w*Warning: ")  # setuptools' warning categories (InformationOnly is not one)


def _config():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _copy_sources(dest):
    """The files a build reads (tracked and new, not ignored ones), copied: no build/ or egg-info
    lands in the shared checkout."""
    config = _config()
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "pyproject.toml", "README.md",
                             *config["package-dir"].values()],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for rel in listed:
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return listed


def _backend(hook, src, out):
    """setuptools' build hook run in a child (the venv's setuptools: no build isolation, no network)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # (its own "byte-compiling" note)
    code = f"from setuptools import build_meta; print(build_meta.{hook}({out!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1], done.stdout + done.stderr


@pytest.mark.slow
def test_wheel_and_editable_builds_print_no_warnings_and_the_wheel_has_every_data_file(tmp_path):
    src = tmp_path / "src"
    listed = _copy_sources(src)
    name, output = _backend("build_wheel", src, str(tmp_path / "wheel"))
    assert not WARNING.findall(output), "\n".join(line for line in output.splitlines() if WARNING.search(line))
    with zipfile.ZipFile(tmp_path / "wheel" / name) as whl:
        in_wheel = set(whl.namelist())
    folders = {folder: package for package, folder in _config()["package-dir"].items()}
    expected = set()
    for rel in listed:
        top, _, rest = rel.partition("/")
        if top in folders and rest and not rel.endswith(".py"):
            expected.add(folders[top].replace(".", "/") + "/" + rest)
    assert len(expected) > 50  # the .wgsl, .kernels, .h, .metal and .js files
    assert expected - in_wheel == set()
    _, output = _backend("build_editable", src, str(tmp_path / "editable"))
    assert not WARNING.findall(output), "\n".join(line for line in output.splitlines() if WARNING.search(line))


def _entry_point():
    script = os.path.join(os.path.dirname(sys.executable), "tallow")
    return script if os.path.exists(script) else shutil.which("tallow")


@pytest.mark.skipif(importlib.util.find_spec("wgpu") is None, reason="the wgpu package is not installed")
@pytest.mark.parametrize("runtime", [None, "relative/path"])
def test_devices_prints_no_xdg_runtime_dir_lines(runtime):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if runtime is not None:
        env["XDG_RUNTIME_DIR"] = runtime
    done = subprocess.run([_entry_point(), "devices"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr
    assert "wgpu" in done.stdout  # the probe ran (available or not, with its reason)


@pytest.mark.parametrize("runtime", [None, "relative/path"])
def test_the_probe_restores_the_environment_and_removes_its_folder(runtime):
    """The private folder lives only for the probe: afterwards the variable is as the user left
    it (children see the user's environment) and the folder is gone."""
    code = ("import os, tempfile; from tallow_wgpu import driver_native as d\n"
            "before = os.environ.get('XDG_RUNTIME_DIR')\n"
            "seen = []\n"
            "class Gpu:\n"
            "    def request_adapter_sync(self, **kw):\n"
            "        seen.append(os.environ['XDG_RUNTIME_DIR']); return 'adapter'\n"
            "class Wgpu: gpu = Gpu()\n"
            "assert d._request_adapter(Wgpu()) == 'adapter'\n"
            "folder, = seen\n"
            "assert os.path.isabs(folder) and not os.path.exists(folder), folder\n"
            "assert os.environ.get('XDG_RUNTIME_DIR') == before\n"
            "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if runtime is not None:
        env["XDG_RUNTIME_DIR"] = runtime
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
