"""Whisper's log-mel spectrogram, numerically the same as openai-whisper's
`whisper.audio.log_mel_spectrogram`: 400-point STFT with a periodic Hann
window, hop 160, reflect padding of 200 samples on both sides (torch.stft's
center=True), the last frame dropped, power spectrum, mel filter bank,
log10 clamped at 1e-10, floor at (max - 8), then (x + 4) / 4.

numpy (np.fft.rfft) when present, a pure-Python FFT otherwise. The result is a
float32 numpy array of shape (n_mels, frames), or in pure Python a list of
n_mels array('f') rows.
"""
import math
from array import array
from operator import mul

from ..errors import Error
from .fft import rfft_power
from .filters import mel_filters
from .stream import check_samples
from .wav import numpy_or_none

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples: the 30 s Whisper sees at once
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames


def pad_or_trim(samples, n=N_SAMPLES):
    """The first n samples, zero-padded at the end to exactly n (Whisper's input length).
    numpy arrays stay numpy arrays; anything else becomes an array('f')."""
    if hasattr(samples, "__array_interface__"):
        import numpy as np

        out = np.zeros(n, dtype=samples.dtype if samples.dtype.kind == "f" else np.float32)
        k = min(n, len(samples))
        out[:k] = samples[:k]
        return out
    out = array("f", samples[:n])
    if len(out) < n:
        out.extend(array("f", bytes(4 * (n - len(out)))))
    return out


def log_mel_spectrogram(samples, n_mels=80, padding=0, filters=None, use_numpy=None):
    """Log-mel spectrogram (n_mels, len(samples + padding) // 160) of 16 kHz mono
    float samples. `filters`: a mel_filters.npz path, or None to use the
    librosa-identical filter bank computed by tallow.audio.mel_filters.
    `use_numpy`: None = numpy when importable, True/False to force."""
    if hasattr(samples, "numpy") and not hasattr(samples, "__array_interface__"):
        samples = samples.numpy()  # a tallow or torch tensor
    n = len(samples) + padding
    if n <= N_FFT // 2:
        raise Error(f"log_mel_spectrogram: need more than {N_FFT // 2} samples (with padding) "
                    f"for the reflect padding, got {n}")
    check_samples(samples, "log_mel_spectrogram")  # huge samples overflow the float32 power spectrum to NaN
    np = numpy_or_none(use_numpy)
    bank = mel_filters(n_mels, filters)
    if np is not None:
        return _log_mel_numpy(np, samples, padding, bank)
    return _log_mel_python(samples, padding, bank)


def log_mel_frames(x, n_frames, n_mels=80, filters=None, use_numpy=None):
    """Whisper's log-mel of n_frames frames where frame f is x[160 f : 160 f + 400]:
    the caller has done the padding (log_mel_spectrogram: reflect; the transcriber:
    the neighbouring audio), and the floor at (max - 8) is over these frames only."""
    if len(x) < (n_frames - 1) * HOP_LENGTH + N_FFT:
        raise Error(f"log_mel_frames: {n_frames} frames need {(n_frames - 1) * HOP_LENGTH + N_FFT} samples, "
                    f"got {len(x)}")
    check_samples(x, "log_mel_frames")  # the transcriber's streams are checked already: this is for other callers
    np = numpy_or_none(use_numpy)
    bank = mel_filters(n_mels, filters)
    if np is not None:
        return _frames_numpy(np, np.asarray(x, dtype=np.float32).ravel(), n_frames, bank)
    return _frames_python(x, n_frames, bank)


def _log_mel_numpy(np, samples, padding, bank):
    x = np.asarray(samples, dtype=np.float32).ravel()
    if padding:
        x = np.concatenate([x, np.zeros(padding, np.float32)])
    n_frames = len(x) // HOP_LENGTH  # torch.stft gives one more; Whisper drops it
    return _frames_numpy(np, np.pad(x, N_FFT // 2, mode="reflect"), n_frames, bank)


def _frames_numpy(np, x, n_frames, bank):
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP_LENGTH][:n_frames]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    spectrum = np.fft.rfft(frames * window, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)  # (frames, 201)
    mel = bank.numpy() @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def _log_mel_python(samples, padding, bank):
    x = list(samples)
    if padding:
        x.extend([0.0] * padding)
    half = N_FFT // 2
    x = x[half:0:-1] + x + x[-2:-half - 2:-1]  # reflect: the edge sample is not repeated
    n_frames = (len(x) - N_FFT) // HOP_LENGTH  # torch.stft gives one more; Whisper drops it
    return _frames_python(x, n_frames, bank)


def _frames_python(x, n_frames, bank):
    window = [0.5 - 0.5 * math.cos(2 * math.pi * i / N_FFT) for i in range(N_FFT)]
    sparse = bank.sparse_rows()
    rows = [array("f", bytes(4 * n_frames)) for _ in sparse]
    log10 = math.log10
    for f in range(n_frames):
        start = f * HOP_LENGTH
        power = rfft_power(list(map(mul, window, x[start:start + N_FFT])))
        for row, (first, weights) in zip(rows, sparse):
            value = sum(map(mul, weights, power[first:first + len(weights)]))
            row[f] = log10(value if value > 1e-10 else 1e-10)
    floor = max(max(row) for row in rows) - 8.0
    for row in rows:
        row[:] = array("f", [((v if v > floor else floor) + 4.0) / 4.0 for v in row])
    return rows
