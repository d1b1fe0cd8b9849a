"""Assemble the static demo site in web/dist/ (git-ignored).

    python web/build.py [--dist DIR] [--no-models] [--force]
    tallow web build                      # the same, from the command line

dist/ gets:
    index.html app.js audio.js style.css worker.mjs worker.py   (copied from web/src/)
    pyodide/        the Pyodide runtime files from web/node_modules/pyodide (npm ci in web/)
    wheels/         the tallow wheel (built from this checkout), jinja2's wheel and a
                    pure-Python markupsafe archive, listed in wheels/index.json
    models/         manifest.json + the model files, symlinked from the tallow cache
                    (~/.cache/tallow: `tallow fetch whisper-tiny.en smollm2-135m-instruct`)

Pyodide here ships no micropip, so the worker unpacks each archive of
wheels/index.json into site-packages itself. markupsafe has no pure wheel on
PyPI (only platform wheels and an sdist); its sdist carries the pure-Python
fallback (_native.py), which is what goes into markupsafe.zip.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

WEB = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(WEB)
SRC = os.path.join(WEB, "src")
DEFAULT_DIST = os.path.join(WEB, "dist")
PYODIDE_DIR = os.path.join(WEB, "node_modules", "pyodide")
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
SITE_FILES = ("index.html", "app.js", "audio.js", "style.css", "worker.mjs", "worker.py")

# What the demo offers: cache name -> how the worker loads it.
MODELS = {
    "whisper-tiny.en": {"kind": "whisper", "title": "Whisper tiny.en (speech to text)",
                        "files": ["config.json", "generation_config.json", "preprocessor_config.json",
                                  "tokenizer.json", "mel_filters.npz", "model.safetensors"]},
    "smollm2-135m-instruct": {"kind": "llm", "title": "SmolLM2-135M-Instruct Q4_1 (chat)",
                              "files": ["SmolLM2-135M-Instruct.Q4_1.gguf"]},
}


class BuildError(Exception):
    """The site cannot be assembled; the message says what to install or fetch."""


def _log(quiet, *parts):
    if not quiet:
        print(*parts, file=sys.stderr)


def _load_node_runner():
    # The wheel builder lives with the Pyodide tests (tests/ is not a package: load by path).
    path = os.path.join(REPO_ROOT, "tests", "pyodide", "node_runner.py")
    spec = importlib.util.spec_from_file_location("tallow_web_node_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_pyodide(dist, pyodide_dir=PYODIDE_DIR):
    if not os.path.exists(os.path.join(pyodide_dir, "pyodide.mjs")):
        raise BuildError(f"no Pyodide runtime at {pyodide_dir}: run `npm ci` in {WEB}")
    out = os.path.join(dist, "pyodide")
    os.makedirs(out, exist_ok=True)
    for name in PYODIDE_FILES:
        src, dst = os.path.join(pyodide_dir, name), os.path.join(out, name)
        if not os.path.exists(dst) or os.path.getmtime(dst) < os.path.getmtime(src):
            shutil.copy2(src, dst)
    with open(os.path.join(pyodide_dir, "package.json")) as f:
        return json.load(f)["version"]


def build_tallow_wheel(wheels_dir):
    """Build the tallow wheel from this checkout into wheels_dir; returns its file name."""
    runner = _load_node_runner()
    for old in os.listdir(wheels_dir):
        if old.startswith("tallow-") and old.endswith(".whl"):
            os.remove(os.path.join(wheels_dir, old))
    with tempfile.TemporaryDirectory() as tmp:
        wheel, _ = runner.build_wheel(tmp)
        name = os.path.basename(wheel)
        shutil.copy2(wheel, os.path.join(wheels_dir, name))
    return name


def _pip_download(args, dest):
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise BuildError(f"pip download {' '.join(args)} failed: {done.stderr.strip()[-500:]}")


def vendor_jinja(wheels_dir, cache_dir):
    """jinja2's wheel and markupsafe's pure-Python modules (from its sdist) for chat templates."""
    os.makedirs(cache_dir, exist_ok=True)
    if not any(f.startswith("jinja2-") and f.endswith(".whl") for f in os.listdir(cache_dir)):
        _pip_download(["--only-binary", ":all:", "jinja2"], cache_dir)
    if not any(f.startswith("markupsafe-") and f.endswith(".tar.gz") for f in os.listdir(cache_dir)):
        _pip_download(["--no-binary", ":all:", "markupsafe"], cache_dir)
    jinja = sorted(f for f in os.listdir(cache_dir) if f.startswith("jinja2-") and f.endswith(".whl"))[-1]
    shutil.copy2(os.path.join(cache_dir, jinja), os.path.join(wheels_dir, jinja))
    sdist = sorted(f for f in os.listdir(cache_dir) if f.startswith("markupsafe-") and f.endswith(".tar.gz"))[-1]
    archive = "markupsafe-pure.zip"
    with tarfile.open(os.path.join(cache_dir, sdist)) as tar, \
            zipfile.ZipFile(os.path.join(wheels_dir, archive), "w", zipfile.ZIP_DEFLATED) as out:
        for member in tar.getmembers():
            parts = member.name.split("/")
            # <name>-<version>/src/markupsafe/<module>.py: the C speedups are left out on purpose
            if member.isfile() and len(parts) == 4 and parts[1:3] == ["src", "markupsafe"] \
                    and parts[3].endswith((".py", ".typed")):
                out.writestr(f"markupsafe/{parts[3]}", tar.extractfile(member).read())
    return [jinja, archive]


def _tallow_home():
    return os.environ.get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")


def link_models(dist, home=None, quiet=False):
    """Symlink the demo's model files from the tallow cache into dist/models and write the manifest.
    A model that is not in the cache is listed as missing (the page says how to fetch it)."""
    home = home or _tallow_home()
    out = os.path.join(dist, "models")
    os.makedirs(out, exist_ok=True)
    manifest = {"models": {}}
    for name, spec in MODELS.items():
        entry = {"kind": spec["kind"], "title": spec["title"], "files": [], "missing": None}
        src_dir = os.path.join(home, name)
        absent = [f for f in spec["files"] if not os.path.isfile(os.path.join(src_dir, f))]
        if absent:
            entry["missing"] = f"not in {src_dir}: run `tallow fetch {name}` and rebuild"
            _log(quiet, f"web build: {name} missing ({', '.join(absent)}); run `tallow fetch {name}`")
        else:
            os.makedirs(os.path.join(out, name), exist_ok=True)
            for f in spec["files"]:
                src, dst = os.path.join(src_dir, f), os.path.join(out, name, f)
                if os.path.lexists(dst):
                    os.remove(dst)
                os.symlink(os.path.realpath(src), dst)
                st = os.stat(src)
                # The version tag is part of the URL, so a changed file is a new cache entry in the browser.
                tag = hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
                entry["files"].append({"name": f, "url": f"models/{name}/{f}?v={tag}", "size": st.st_size})
        entry["bytes"] = sum(f["size"] for f in entry["files"])
        manifest["models"][name] = entry
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def copy_site(dist):
    for name in SITE_FILES:
        shutil.copy2(os.path.join(SRC, name), os.path.join(dist, name))


def build(dist=DEFAULT_DIST, models=True, wheel=True, quiet=False, home=None):
    """Assemble the site; returns a summary dict. Raises BuildError when a requirement is missing."""
    os.makedirs(dist, exist_ok=True)
    summary = {"dist": dist, "pyodide": copy_pyodide(dist)}
    wheels_dir = os.path.join(dist, "wheels")
    os.makedirs(wheels_dir, exist_ok=True)
    index_path = os.path.join(wheels_dir, "index.json")
    if wheel or not os.path.exists(index_path):
        archives = [build_tallow_wheel(wheels_dir)]
        try:
            archives += vendor_jinja(wheels_dir, os.path.join(WEB, "node_modules", ".tallow-vendor"))
        except BuildError as e:
            _log(quiet, f"web build: no jinja2 for chat templates ({e}); the chat panel will say so")
        with open(index_path, "w") as f:
            json.dump({"archives": archives}, f, indent=1)
    with open(index_path) as f:
        summary["archives"] = json.load(f)["archives"]
    copy_site(dist)
    if models:
        summary["models"] = {k: v["missing"] or v["bytes"] for k, v in link_models(dist, home, quiet)["models"].items()}
    elif not os.path.exists(os.path.join(dist, "models", "manifest.json")):
        os.makedirs(os.path.join(dist, "models"), exist_ok=True)
        with open(os.path.join(dist, "models", "manifest.json"), "w") as f:
            json.dump({"models": {}}, f)
    _log(quiet, f"web build: {dist} (pyodide {summary['pyodide']}, {', '.join(summary['archives'])})")
    return summary


def is_built(dist=DEFAULT_DIST):
    return all(os.path.exists(os.path.join(dist, p)) for p in
               ("index.html", "worker.mjs", "pyodide/pyodide.mjs", "wheels/index.json", "models/manifest.json"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", default=DEFAULT_DIST)
    parser.add_argument("--no-models", action="store_true", help="do not link models from the tallow cache")
    args = parser.parse_args(argv)
    try:
        build(args.dist, models=not args.no_models)
    except BuildError as e:
        print(f"web build failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
