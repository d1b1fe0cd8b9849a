"""load_audio: any audio file or bytes -> mono float32 samples at 16 kHz.

WAV is decoded in pure Python (numpy when present); other formats (mp3, flac,
ogg, m4a, ...) go through the `ffmpeg` binary when it is on PATH.
"""
import os
import shutil
import subprocess
from array import array

from ..errors import FormatError
from .resample import resample
from .wav import decode_wav, is_wav


def _read(source):
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>", None
    path = os.fspath(source)
    try:
        with open(path, "rb") as fh:
            return fh.read(), path, path
    except OSError as e:
        raise FormatError(f"{path}: cannot read audio file: {e.strerror or e}") from e


def decode_with_ffmpeg(data, name, path, sr):
    """Decode anything ffmpeg understands to mono 16-bit PCM at sr, then to floats."""
    exe = shutil.which("ffmpeg")
    if exe is None:
        raise FormatError(
            f"{name}: not a WAV file (starts with {data[:12]!r}) and ffmpeg is not on PATH: "
            "install ffmpeg (e.g. `apt-get install ffmpeg`) or convert the audio to WAV"
        )
    cmd = [exe, "-nostdin", "-loglevel", "error", "-i", path or "pipe:0",
           "-f", "s16le", "-ac", "1", "-acodec", "pcm_s16le", "-ar", str(sr), "pipe:1"]
    run = subprocess.run(cmd, input=None if path else data, capture_output=True)
    if run.returncode != 0:
        raise FormatError(f"{name}: ffmpeg could not decode it: {run.stderr.decode(errors='replace').strip()[-500:]}")
    pcm = array("h")
    pcm.frombytes(run.stdout[: len(run.stdout) // 2 * 2])
    if array("h", [1]).tobytes() != b"\x01\x00":
        pcm.byteswap()
    return array("f", [v / 32768.0 for v in pcm])


def load_audio(source, sr=16000, use_numpy=None):
    """Mono float32 samples in [-1, 1) at `sr` Hz, as an array('f') (zero-copy to
    numpy with np.frombuffer(a, np.float32), to tallow with
    tallow.from_buffer(a, "f32", (len(a),))).

    source: a path (str / os.PathLike) or the file's bytes. WAV in any common
    PCM/float layout is decoded natively and resampled with a band-limited
    polyphase filter; other formats need the ffmpeg binary.
    """
    data, name, path = _read(source)
    if not is_wav(data):
        return decode_with_ffmpeg(data, name, path, sr)
    samples, info = decode_wav(data, name, use_numpy=use_numpy)
    if info.sample_rate != sr:
        samples = resample(samples, info.sample_rate, sr, use_numpy=use_numpy)
    if isinstance(samples, array):
        return samples
    out = array("f")
    out.frombytes(samples.astype("<f4" if array("h", [1]).tobytes() == b"\x01\x00" else ">f4").tobytes())
    return out
