"""stream_audio: any audio file or bytes as chunks of mono float32 samples at 16 kHz,
read, decoded and resampled a chunk at a time, so memory does not grow with the
length of the audio. WAV is read from the file incrementally; other formats
stream out of ffmpeg. NaN, infinite or absurdly large samples are a FormatError."""
import io
import math
import os

from ..errors import Error, FormatError
from .ffmpeg import ffmpeg_chunks
from .resample import Resampler
from .wav import is_wav, open_wav, read_blocks

CHUNK_SECONDS = 10
# The largest sample magnitude accepted. Float audio's full scale is +-1; a mix may run a
# few dB over, and 100 is +40 dB, more than any recording. Past it the audio is corrupt
# or wrongly scaled (integer values stored as floats): Whisper's log-mel leaves the range
# it was trained on (jfk.wav scaled to a peak of 100 loses words, to 400 transcribes as
# nothing), and from about 9e16 the float32 power spectrum overflows to NaN, which
# transcribed 1 s of 1e20 samples as "!!!!..." in 10-18 s.
MAX_SAMPLE_MAGNITUDE = 100.0
_RULE = f"NaN, infinite or larger than {MAX_SAMPLE_MAGNITUDE:g} in magnitude"


def stream_audio(source, sr=16000, chunk_seconds=CHUNK_SECONDS, use_numpy=None):
    """Chunks (float32 numpy arrays, or array('f') without numpy) of mono samples at `sr`.
    source: a path (str / os.PathLike) or the file's bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not is_wav(data):
            yield from finite_chunks(ffmpeg_chunks("<bytes>", data=data, sr=sr, chunk_samples=int(chunk_seconds * sr),
                                                   use_numpy=use_numpy), "<bytes>", sr)
            return
        yield from _wav_chunks(io.BytesIO(data), "<bytes>", sr, chunk_seconds, use_numpy)
        return
    path = os.fspath(source)
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise FormatError(f"{path}: cannot read audio file: {e.strerror or e}") from e
    with fh:
        wav = is_wav(fh.read(12))
        if wav:
            fh.seek(0)
            yield from _wav_chunks(fh, path, sr, chunk_seconds, use_numpy)
    if not wav:
        yield from finite_chunks(ffmpeg_chunks(path, path=path, sr=sr, chunk_samples=int(chunk_seconds * sr),
                                               use_numpy=use_numpy), path, sr)


def _wav_chunks(fh, name, sr, chunk_seconds, use_numpy):
    info, offset, size = open_wav(fh, name)
    blocks = read_blocks(fh, info, offset, size, max(1, int(chunk_seconds * info.sample_rate)), use_numpy)
    blocks = finite_chunks(blocks, name, info.sample_rate)  # checked before resampling: positions in the file
    if info.sample_rate == sr:
        yield from blocks
        return
    resampler = Resampler(info.sample_rate, sr, use_numpy=use_numpy)
    for block in blocks:
        out = resampler.process(block)
        if len(out):
            yield out
    out = resampler.finish()
    if len(out):
        yield out


def finite_chunks(chunks, name, sr):
    """The chunks, checked: at the first NaN, infinite or out-of-range sample
    (MAX_SAMPLE_MAGNITUDE) the rest is only counted, and a FormatError says how many
    there are and where the first is."""
    seen = 0
    chunks = iter(chunks)
    for chunk in chunks:
        bad, first = count_unusable(chunk)
        if bad:
            where, total = seen + first, seen + len(chunk)
            for rest in chunks:
                bad += count_unusable(rest)[0]
                total += len(rest)
            raise FormatError(
                f"{name}: {bad} of {total} samples are {_RULE} (the first at sample {where}, {where / sr:.2f} s; "
                "float audio's full scale is -1 to 1): the audio is corrupt; re-export it from its source")
        seen += len(chunk)
        yield chunk


def count_unusable(chunk):
    """(how many samples are NaN, +-inf or beyond MAX_SAMPLE_MAGNITUDE, index of the first or None)."""
    limit = MAX_SAMPLE_MAGNITUDE
    if hasattr(chunk, "__array_interface__"):
        import numpy as np

        ok = (chunk >= -limit) & (chunk <= limit)  # False for NaN; no abs(), which wraps int16's -32768
        if ok.all():
            return 0, None
        return int(ok.size - np.count_nonzero(ok)), int(np.argmin(ok))
    if len(chunk) == 0 or all(map(math.isfinite, chunk)) and -limit <= min(chunk) and max(chunk) <= limit:
        return 0, None
    bad = [i for i, v in enumerate(chunk) if not -limit <= v <= limit]
    return len(bad), bad[0]


def check_samples(samples, name="audio samples"):
    """Raise an Error if an in-memory signal has NaN, infinite or out-of-range samples."""
    bad, first = count_unusable(samples)
    if bad:
        raise Error(f"{name}: {bad} of {len(samples)} samples are {_RULE} (the first at index {first}): float "
                    "audio's full scale is -1 to 1 (integer samples? divide int16 ones by 32768)")
