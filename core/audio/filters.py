"""Mel filter banks for Whisper (16 kHz, n_fft 400 -> 201 frequency bins).

Either read from openai-whisper's mel_filters.npz (`tallow fetch whisper-tiny.en`
puts a copy next to the model), or computed here with librosa's formula
(`librosa.filters.mel(sr=16000, n_fft=400, n_mels=n)`: Slaney mel scale and
Slaney area normalisation), which is what that file was saved from, so no file
is needed at all.
"""
import math
import sys
from array import array
from functools import lru_cache

from ..errors import Error, FormatError

N_BINS = 201  # n_fft // 2 + 1


class MelFilterBank:
    """An (n_mels, 201) float32 matrix, kept as array('f') rows."""

    def __init__(self, rows, source):
        self.rows = rows
        self.source = source
        self.shape = (len(rows), len(rows[0]) if rows else 0)

    def __repr__(self):
        return f"MelFilterBank({self.shape[0]}x{self.shape[1]}, from {self.source})"

    def numpy(self):
        import numpy as np

        return np.array([list(r) for r in self.rows], dtype=np.float32)

    def sparse_rows(self):
        """Per mel band, (first non-zero bin, weights up to the last non-zero bin):
        each triangular filter touches only a few bins."""
        out = []
        for row in self.rows:
            nz = [i for i, v in enumerate(row) if v != 0.0]
            first, last = (nz[0], nz[-1]) if nz else (0, -1)
            out.append((first, list(row[first:last + 1])))
        return out


def _hz_to_mel(f):
    # Slaney: linear below 1 kHz, logarithmic above.
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    if f < min_log_hz:
        return f / f_sp
    return min_log_hz / f_sp + math.log(f / min_log_hz) / (math.log(6.4) / 27.0)


def _mel_to_hz(m):
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel = min_log_hz / f_sp
    if m < min_log_mel:
        return f_sp * m
    return min_log_hz * math.exp(math.log(6.4) / 27.0 * (m - min_log_mel))


def compute_mel_filters(n_mels, sample_rate=16000, n_fft=400):
    """librosa.filters.mel(sr, n_fft, n_mels) (fmin 0, fmax sr/2, Slaney), as rows."""
    n_bins = n_fft // 2 + 1
    fft_freqs = [i * (sample_rate / 2) / (n_bins - 1) for i in range(n_bins)]
    lo, hi = _hz_to_mel(0.0), _hz_to_mel(sample_rate / 2)
    mel_f = [_mel_to_hz(lo + (hi - lo) * i / (n_mels + 1)) for i in range(n_mels + 2)]
    rows = []
    for i in range(n_mels):
        left, center, right = mel_f[i], mel_f[i + 1], mel_f[i + 2]
        norm = 2.0 / (right - left)
        row = array("f")
        for f in fft_freqs:
            rising = (f - left) / (center - left)
            falling = (right - f) / (right - center)
            row.append(max(0.0, min(rising, falling)) * norm)
        rows.append(row)
    return rows


@lru_cache(maxsize=8)
def _cached(n_mels, path):
    if path is None:
        return MelFilterBank(compute_mel_filters(n_mels), "librosa formula")
    from ..io import open as open_weights

    key = f"mel_{n_mels}"
    with open_weights(path, format="npz") as f:
        if key not in f.keys():
            raise FormatError(f"{path}: has no {key!r} filter bank (has {sorted(f.keys())})")
        info = f.info(key)
        if info.shape != (n_mels, N_BINS) or info.dtype.name != "f32":
            raise FormatError(f"{path}: {key} is {info.dtype.name}{list(info.shape)}, expected f32[{n_mels}, {N_BINS}]")
        flat = array("f")
        flat.frombytes(bytes(f.raw(key)))
    if sys.byteorder == "big":
        flat.byteswap()
    return MelFilterBank([flat[i * N_BINS:(i + 1) * N_BINS] for i in range(n_mels)], str(path))


def mel_filters(n_mels=80, path=None):
    """The Whisper mel filter bank (n_mels x 201): from a mel_filters.npz path,
    or computed when path is None. n_mels is 80 (Whisper v1/v2) or 128 (v3)."""
    if isinstance(path, MelFilterBank):
        return path
    if n_mels not in (80, 128):
        raise Error(f"mel_filters: Whisper uses 80 or 128 mel bands, got n_mels={n_mels}")
    return _cached(n_mels, None if path is None else str(path))
