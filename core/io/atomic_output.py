"""Outputs that appear whole or not at all.

A writer opens `atomic_output(path)` instead of `open(path, "wb")`: the bytes go
to a temporary file in the destination's folder, which is flushed, fsynced and
renamed over `path` only when the writer finished without an error. A crash or
Ctrl-C leaves the old file (or none), never a truncated one, and a source that
is memory-mapped while its output is written keeps its bytes (the rename gives
the output a new inode; the mapping still sees the old one).
"""
import contextlib
import os
import secrets

from ..errors import Error


def same_file(a, b):
    """True when paths a and b name one file (any spelling, symlink or hard link)."""
    try:
        return os.path.samefile(a, b)  # compares st_dev and st_ino
    except (OSError, ValueError):
        return False  # one of them does not exist (yet): not the same file


def check_output_path(path, sources=()):
    """A clear tallow Error when `path` cannot be an output file: a directory, a missing
    or unwritable folder, or one of the `sources` being read to make it."""
    path = os.fspath(path)
    if "\0" in path:
        raise Error(f"{path!r}: an output path cannot contain a null byte")
    if os.path.isdir(path):
        raise Error(f"{path}: is a directory; give a file name for the output")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise Error(f"{path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Error(f"{path}: cannot write in {folder} (permission denied); choose another output folder")
    for source in sources:
        if same_file(source, path):
            raise Error(f"{path}: is the input file {os.fspath(source)}; write the output to a different file")


@contextlib.contextmanager
def atomic_output(path, mode="wb", encoding=None):
    """A file object for writing `path`, renamed into place when the with-block ends cleanly."""
    path = os.fspath(path)
    check_output_path(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # O_EXCL: never reuse someone else's file; 0o666 & umask: the mode a plain open() gives.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as e:
        raise Error(f"{path}: cannot create the output in {folder}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            _fsync(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_abandoned(path):
    """Delete the temporary files that writers of `path` left when their process died
    (killed mid-write, so the rename never came). A file whose writer still runs is kept."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    prefix = f".{name}."
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            pid = entry[len(prefix):].split(".", 1)[0]
            if entry.startswith(prefix) and entry.endswith(".tmp") and pid.isdigit() and not _running(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, entry))


def _running(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, AttributeError):
        return True  # someone else's process, or no way to ask: keep its file
    return True


def _fsync(f):
    try:
        os.fsync(f.fileno())
    except OSError:
        pass  # some filesystems (Pyodide's in-memory one, some FUSE mounts) have no fsync; the rename still applies
