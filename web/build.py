"""Assemble the static demo site: web/dist/ (git-ignored) or any folder.

    python web/build.py [--out DIR] [--no-models] [--part-mb N] [--test-hooks]
    tallow web build [--out DIR] [--part-mb N]      # the same, from the command line

The folder is self-contained, for any static host (GitHub Pages, a plain
`python3 -m http.server`): real files only (no symlinks) and none over 100 MB.
It gets:
    index.html app.js tallow.mjs audio.js recorder-worklet.js transcript.js style.css worker.mjs worker.py (web/src/)
    isolate.js      a service worker that makes the page cross-origin isolated on hosts that cannot
                    send COOP/COEP headers (the wasm device's threads; web/serve.py sends them)
    site.json       the Python modules the worker installs, the example clip, the runtime's size
    .nojekyll       so GitHub Pages serves the folder as it is
    examples/       jfk.wav, the page's example clip
    kernels.wasm    the wasm device's kernels (docs/wasm.md), when built (`make wasm`); the page
                    does not load it yet
    pyodide/        the Pyodide runtime files from web/node_modules/pyodide (npm ci in web/)
    wheels/         the tallow wheel (built from this checkout), jinja2's wheel and a
                    pure-Python markupsafe archive, listed in wheels/index.json
    models/         manifest.json + the model files, copied from the tallow cache
                    (~/.cache/tallow: `tallow fetch whisper-tiny.en smollm2-135m-instruct`);
                    a file over the part size (default 90 MB; --part-mb or $TALLOW_WEB_PART_MB
                    lower it) is written as NAME.part000, NAME.part001... listed in the manifest,
                    which the worker fetches, caches and joins into one buffer.
test_hooks.py (web/testing/) joins only with --test-hooks: it lets the browser
tests evaluate Python in the worker; the shipped site has no such request.

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
SITE_FILES = ("index.html", "isolate.js", "app.js", "tallow.mjs", "audio.js", "recorder-worklet.js", "transcript.js",
              "style.css", "worker.mjs", "worker.py")
TEST_HOOKS = "test_hooks.py"  # web/testing/: only in test builds (evaluates Python on request)
EXAMPLE_CLIP = os.path.join(REPO_ROOT, "tests", "data", "jfk.wav")
WASM_KERNELS = os.path.join(REPO_ROOT, "core", "backends", "wasm", "kernels.wasm")  # `make wasm` builds it
MB = 10**6
MAX_FILE_BYTES = 100 * MB  # GitHub Pages refuses files over 100 MB
DEFAULT_PART_MB = 90

# What the demo offers: cache name -> how the worker loads it.
# cost: rough multiply-adds x2 (FLOPs) of the work a user waits for, to turn a measured CPU rate
# into an up-front estimate: Whisper tiny's encoder (about 8M weights) over 1500 positions per
# 30 s window plus about 40 decoder steps; one chat token is about 2 x the 135M weights.
MODELS = {
    "whisper-tiny.en": {"kind": "whisper", "title": "Whisper tiny.en (speech to text)",
                        "cost": {"flops_per_window": 2.6e10},
                        "files": ["config.json", "generation_config.json", "preprocessor_config.json",
                                  "tokenizer.json", "mel_filters.npz", "model.safetensors"]},
    "smollm2-135m-instruct": {"kind": "llm", "title": "SmolLM2-135M-Instruct Q4_1 (chat)",
                              "cost": {"flops_per_token": 2.7e8},
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


def part_bytes_from_env():
    """The part size in bytes: $TALLOW_WEB_PART_MB when set (CI lowers it to exercise splitting), else the default."""
    text = os.environ.get("TALLOW_WEB_PART_MB")
    if text is None:
        return DEFAULT_PART_MB * MB
    return checked_part_bytes(text, "$TALLOW_WEB_PART_MB")


def checked_part_bytes(value, where="--part-mb"):
    try:
        mb = float(value)
    except (TypeError, ValueError):
        raise BuildError(f"{where} must be a number of MB, not {value!r}") from None
    if not 0 < mb * MB <= MAX_FILE_BYTES or mb != mb:
        raise BuildError(f"{where} must be more than 0 and at most {MAX_FILE_BYTES // MB} MB (the GitHub Pages "
                         f"file limit), not {value!r}")
    return max(1, int(mb * MB))


def _same_file(path, size):
    return os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == size


def _copy_parts(src, dst, size, part_bytes):
    """Copy src to dst, or to dst.part000, dst.part001... of part_bytes each when it is bigger.
    Returns the part file names (None when the file stays whole)."""
    if size <= part_bytes:
        if os.path.lexists(dst) and not _same_file(dst, size):
            os.remove(dst)  # an old build's symlink, or a changed file
        if not _same_file(dst, size) or os.path.getmtime(dst) < os.path.getmtime(src):
            shutil.copy2(src, dst)
        return None
    names = []
    with open(src, "rb") as f:
        for i, at in enumerate(range(0, size, part_bytes)):
            name = f"{os.path.basename(dst)}.part{i:03d}"
            path = os.path.join(os.path.dirname(dst), name)
            n = min(part_bytes, size - at)
            if _same_file(path, n) and os.path.getmtime(path) >= os.path.getmtime(src):
                f.seek(at + n)
            else:
                if os.path.lexists(path):
                    os.remove(path)
                with open(path, "wb") as out:
                    f.seek(at)
                    left = n
                    while left:
                        chunk = f.read(min(left, 1 << 22))
                        out.write(chunk)
                        left -= len(chunk)
            names.append(name)
    return names


def copy_models(dist, home=None, quiet=False, part_bytes=None):
    """Copy the demo's model files from the tallow cache into dist/models (real files, so the folder
    can go to any static host) and write the manifest. A file bigger than part_bytes is written as
    parts that the worker joins. A model that is not in the cache is listed as missing (the page
    says how to fetch it)."""
    home = home or _tallow_home()
    part_bytes = part_bytes or part_bytes_from_env()
    out = os.path.join(dist, "models")
    os.makedirs(out, exist_ok=True)
    manifest = {"part_bytes": part_bytes, "models": {}}
    for name, spec in MODELS.items():
        entry = {"kind": spec["kind"], "title": spec["title"], "multilingual": spec.get("multilingual", False),
                 "cost": spec["cost"], "files": [], "missing": None}
        src_dir = os.path.join(home, name)
        absent = [f for f in spec["files"] if not os.path.isfile(os.path.join(src_dir, f))]
        folder = os.path.join(out, name)
        if absent:
            entry["missing"] = f"not in {src_dir}: run `tallow fetch {name}` and rebuild"
            _log(quiet, f"web build: {name} missing ({', '.join(absent)}); run `tallow fetch {name}`")
            shutil.rmtree(folder, ignore_errors=True)
        else:
            os.makedirs(folder, exist_ok=True)
            kept = set()
            for f in spec["files"]:
                src = os.path.realpath(os.path.join(src_dir, f))
                st = os.stat(src)
                # The version tag is part of the URL, so a changed file is a new cache entry in the browser.
                tag = hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}:{part_bytes}".encode()).hexdigest()[:12]
                parts = _copy_parts(src, os.path.join(folder, f), st.st_size, part_bytes)
                item = {"name": f, "url": f"models/{name}/{f}?v={tag}", "size": st.st_size}
                if parts:
                    item["parts"] = [{"url": f"models/{name}/{p}?v={tag}",
                                      "size": os.path.getsize(os.path.join(folder, p))} for p in parts]
                    kept.update(parts)
                else:
                    kept.add(f)
                entry["files"].append(item)
            for stale in set(os.listdir(folder)) - kept:  # parts of an earlier layout, old links
                os.remove(os.path.join(folder, stale))
        entry["bytes"] = sum(f["size"] for f in entry["files"])
        manifest["models"][name] = entry
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def copy_site(dist, test_hooks=False):
    for name in SITE_FILES:
        shutil.copy2(os.path.join(SRC, name), os.path.join(dist, name))
    hooks = os.path.join(dist, TEST_HOOKS)
    if test_hooks:
        shutil.copy2(os.path.join(WEB, "testing", TEST_HOOKS), hooks)
    elif os.path.lexists(hooks):
        os.remove(hooks)  # a test build's leftover: the shipped site must not evaluate code on request
    # GitHub Pages runs Jekyll on a pushed folder unless this file is there; the site needs none of it.
    open(os.path.join(dist, ".nojekyll"), "w").close()
    os.makedirs(os.path.join(dist, "examples"), exist_ok=True)
    shutil.copy2(EXAMPLE_CLIP, os.path.join(dist, "examples", os.path.basename(EXAMPLE_CLIP)))


def write_site_config(dist, archives, test_hooks=False):
    """site.json: the Python modules the worker installs, the example clip, and the bytes the
    runtime downloads before the page is usable (the boot progress bar's total)."""
    python = ["worker.py"] + ([TEST_HOOKS] if test_hooks else [])
    # What the worker fetches (the .mjs files are imported as modules, before any progress can show).
    runtime = [os.path.join("pyodide", n) for n in PYODIDE_FILES if not n.endswith(".mjs")] + \
        [os.path.join("wheels", n) for n in ["index.json", *archives]] + python
    config = {"python": python, "example": f"examples/{os.path.basename(EXAMPLE_CLIP)}",
              "runtime_bytes": sum(os.path.getsize(os.path.join(dist, p)) for p in runtime)}
    with open(os.path.join(dist, "site.json"), "w") as f:
        json.dump(config, f, indent=1)
    return config


def check_static(dist):
    """Refuse a folder a static host would serve wrongly: symlinks (dangling once committed or
    uploaded) and files over the GitHub Pages limit."""
    problems = []
    for root, dirs, files in os.walk(dist):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                problems.append(f"{os.path.relpath(path, dist)} is a symlink")
            elif name in files and os.path.getsize(path) > MAX_FILE_BYTES:
                problems.append(f"{os.path.relpath(path, dist)} is {os.path.getsize(path) / MB:.0f} MB")
    if problems:
        raise BuildError(f"{dist} is not a self-contained static site ({'; '.join(problems[:5])}): "
                         f"every file must be a real file under {MAX_FILE_BYTES // MB} MB")


def copy_wasm_kernels(dist, quiet=True):
    """kernels.wasm at the site's root (fetched by URL, so a browser compiles it as it streams in),
    or a one-line note when it was not built; a stale copy is removed. True when copied."""
    target = os.path.join(dist, "kernels.wasm")
    if os.path.isfile(WASM_KERNELS):
        shutil.copy2(WASM_KERNELS, target)
        return True
    if os.path.lexists(target):
        os.remove(target)
    _log(quiet, "web build: no kernels.wasm (run `make wasm`: it needs lld); the page does not use it yet")
    return False


def build(dist=DEFAULT_DIST, models=True, wheel=True, quiet=False, home=None, part_bytes=None, test_hooks=False):
    """Assemble the site; returns a summary dict. Raises BuildError when a requirement is missing.
    test_hooks=True adds the `run` request (evaluate Python in the worker) that the browser tests use."""
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
    copy_site(dist, test_hooks)
    summary["wasm_kernels"] = copy_wasm_kernels(dist, quiet)
    summary["runtime_bytes"] = write_site_config(dist, summary["archives"], test_hooks)["runtime_bytes"]
    if models:
        summary["models"] = {k: v["missing"] or v["bytes"]
                             for k, v in copy_models(dist, home, quiet, part_bytes)["models"].items()}
    elif not os.path.exists(os.path.join(dist, "models", "manifest.json")):
        os.makedirs(os.path.join(dist, "models"), exist_ok=True)
        with open(os.path.join(dist, "models", "manifest.json"), "w") as f:
            json.dump({"models": {}}, f)
    check_static(dist)
    _log(quiet, f"web build: {dist} (pyodide {summary['pyodide']}, {', '.join(summary['archives'])})")
    return summary


def is_built(dist=DEFAULT_DIST):
    return all(os.path.exists(os.path.join(dist, p)) for p in
               ("index.html", "worker.mjs", "site.json", "pyodide/pyodide.mjs", "wheels/index.json",
                "models/manifest.json"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", "--dist", dest="out", default=DEFAULT_DIST, help="output folder (default web/dist)")
    parser.add_argument("--no-models", action="store_true", help="do not copy models from the tallow cache")
    parser.add_argument("--part-mb", default=None,
                        help=f"split model files bigger than this (default {DEFAULT_PART_MB})")
    parser.add_argument("--test-hooks", action="store_true", help="add the worker's `run` request (tests only)")
    args = parser.parse_args(argv)
    try:
        part = checked_part_bytes(args.part_mb) if args.part_mb is not None else None
        build(args.out, models=not args.no_models, part_bytes=part, test_hooks=args.test_hooks)
    except BuildError as e:
        print(f"web build failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
