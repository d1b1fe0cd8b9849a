"""load_audio: any audio file or bytes -> mono float32 samples at 16 kHz, whole.

For long audio prefer stream_audio (chunks, bounded memory); load_audio is its
chunks joined. WAV is decoded in pure Python (numpy when present); other formats
(mp3, flac, ogg, m4a, ...) go through the `ffmpeg` binary when it is on PATH.
"""
import sys
from array import array

from .stream import stream_audio


def load_audio(source, sr=16000, use_numpy=None):
    """Mono float32 samples in [-1, 1) at `sr` Hz, as an array('f') (zero-copy to
    numpy with np.frombuffer(a, np.float32), to tallow with
    tallow.from_buffer(a, "f32", (len(a),))).

    source: a path (str / os.PathLike) or the file's bytes. WAV in any common
    PCM/float layout is decoded natively and resampled with a band-limited
    polyphase filter; other formats need the ffmpeg binary. NaN, infinite or huge
    samples are a FormatError.
    """
    out = array("f")
    for chunk in stream_audio(source, sr, use_numpy=use_numpy):
        if isinstance(chunk, array):
            out.extend(chunk)
        else:
            out.frombytes(chunk.astype("<f4" if sys.byteorder == "little" else ">f4").tobytes())
    return out
