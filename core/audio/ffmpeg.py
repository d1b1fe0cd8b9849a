"""Decode any format ffmpeg understands (mp3, flac, ogg, m4a, ...) as a stream:
ffmpeg writes mono float32 samples at the wanted rate to a pipe, read in chunks,
so a 3-hour mp3 never sits in memory whole."""
import shutil
import subprocess
import sys
import tempfile
import threading
from array import array

from ..errors import FormatError
from .wav import numpy_or_none


def ffmpeg_chunks(name, path=None, data=None, sr=16000, chunk_samples=160000, use_numpy=None):
    """Chunks of float32 samples (numpy arrays, or array('f') without numpy) of the file
    at `path`, or of the bytes `data` (fed to ffmpeg's stdin)."""
    exe = shutil.which("ffmpeg")
    if exe is None:
        head = data[:12] if data is not None else _head(path)
        raise FormatError(
            f"{name}: not a WAV file (starts with {head!r}) and ffmpeg is not on PATH: "
            "install ffmpeg (e.g. `apt-get install ffmpeg`) or convert the audio to WAV"
        )
    np = numpy_or_none(use_numpy)
    cmd = [exe, "-nostdin", "-loglevel", "error", "-i", path or "pipe:0",
           "-f", "f32le", "-ac", "1", "-acodec", "pcm_f32le", "-ar", str(sr), "pipe:1"]
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a chatty ffmpeg cannot block on it
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if path else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=errors)
        feeder = None
        if not path:
            feeder = threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True)
            feeder.start()
        try:
            while True:
                raw = proc.stdout.read(4 * chunk_samples)
                if len(raw) < 4:
                    break
                yield _floats(np, raw[: len(raw) // 4 * 4])
            if proc.wait() != 0:
                errors.seek(0)
                message = errors.read().decode(errors="replace").strip()[-500:]
                raise FormatError(f"{name}: ffmpeg could not decode it: {message}")
        finally:
            if proc.poll() is None:  # the reader stopped early: do not leave ffmpeg behind
                proc.kill()
                proc.wait()
            proc.stdout.close()
            if feeder is not None:
                feeder.join()


def _feed(pipe, data):
    try:
        pipe.write(data)
    except (BrokenPipeError, ValueError, OSError):
        pass  # ffmpeg stopped reading: its exit status says why
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _floats(np, raw):
    if np is not None:
        return np.frombuffer(raw, "<f4").astype(np.float32)
    out = array("f")
    out.frombytes(raw)
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _head(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(12)
    except OSError:
        return b""
