"""Band-limited sample-rate conversion: a polyphase Kaiser-windowed-sinc filter.

The design is scipy.signal.resample_poly's default, so results agree with it:
for a rate change up/down (in lowest terms) the low-pass FIR has
2 * 10 * max(up, down) + 1 taps, cutoff at the lower of the two Nyquist
frequencies, a Kaiser window with beta 5, unit DC gain per output sample, and is
applied zero-phase with zeros outside the signal. numpy when present, pure
Python otherwise (same filter, same result to float rounding).
"""
import math
from array import array
from operator import mul

from ..errors import Error
from .wav import numpy_or_none

HALF_TAPS_PER_RATE = 10
KAISER_BETA = 5.0


def _bessel_i0(x):
    """Modified Bessel function of the first kind, order 0 (power series)."""
    term, total, k, q = 1.0, 1.0, 0, (x / 2.0) ** 2
    while term > 1e-17 * total:
        k += 1
        term *= q / (k * k)
        total += term
    return total


def lowpass_taps(up, down):
    """The FIR (length 2*half+1) for an up/down rate change, scaled by `up`."""
    rate = max(up, down)
    half = HALF_TAPS_PER_RATE * rate
    n = 2 * half + 1
    cutoff = 1.0 / rate  # relative to the Nyquist frequency of the upsampled signal
    i0_beta = _bessel_i0(KAISER_BETA)
    taps = []
    for i in range(n):
        t = i - half
        window = _bessel_i0(KAISER_BETA * math.sqrt(max(0.0, 1.0 - (t / half) ** 2))) / i0_beta
        arg = math.pi * cutoff * t
        sinc = 1.0 if t == 0 else math.sin(arg) / arg
        taps.append(cutoff * sinc * window)
    gain = up / sum(taps)
    return [h * gain for h in taps], half


def _phase_table(up, down):
    """Per phase r (position of an output sample between input samples), the
    taps that meet input samples q-k for k in [k_lo, k_hi], in that k order."""
    taps, half = lowpass_taps(up, down)
    k_lo = -((half + up - 1) // up) - 1
    k_hi = half // up + 1
    table = []
    for r in range(up):
        row = []
        for k in range(k_lo, k_hi + 1):
            idx = half + r + k * up
            row.append(taps[idx] if 0 <= idx < len(taps) else 0.0)
        table.append(row)
    return table, k_lo, k_hi


def resample(samples, orig_sr, target_sr=16000, use_numpy=None):
    """Resample 1-D float samples from orig_sr to target_sr (Hz, integers).
    Returns an array('f') (pure Python) or a float32 numpy array (numpy path)."""
    if int(orig_sr) != orig_sr or int(target_sr) != target_sr or orig_sr <= 0 or target_sr <= 0:
        raise Error(f"resample: sample rates must be positive integers, got {orig_sr} -> {target_sr}")
    orig_sr, target_sr = int(orig_sr), int(target_sr)
    g = math.gcd(orig_sr, target_sr)
    up, down = target_sr // g, orig_sr // g
    np = numpy_or_none(use_numpy)
    if up == down:
        return np.asarray(samples, np.float32).copy() if np is not None else array("f", samples)
    n_out = -(-len(samples) * up // down)  # ceil, as resample_poly
    table, k_lo, k_hi = _phase_table(up, down)
    if np is not None:
        return _resample_numpy(np, samples, up, down, n_out, table, k_lo, k_hi)
    return _resample_python(samples, up, down, n_out, table, k_lo, k_hi)


def _resample_numpy(np, samples, up, down, n_out, table, k_lo, k_hi):
    x = np.asarray(samples, dtype=np.float64).ravel()
    table = np.asarray(table)
    m = np.arange(n_out, dtype=np.int64) * down
    q, r = m // up, m % up
    # y[m] = sum_k table[r, k] * x[q - k]; pad x so every index is in range.
    pad_lo, pad_hi = k_hi, -k_lo
    xp = np.concatenate([np.zeros(pad_lo), x, np.zeros(pad_hi + 1)])
    y = np.zeros(n_out)
    for j, k in enumerate(range(k_lo, k_hi + 1)):
        y += table[r, j] * xp[q - k + pad_lo]
    return y.astype(np.float32)


def _resample_python(samples, up, down, n_out, table, k_lo, k_hi):
    pad_lo, pad_hi = k_hi, -k_lo
    xp = [0.0] * pad_lo + list(samples) + [0.0] * (pad_hi + 1)
    # taps reversed so that they line up with a forward slice of the input
    rev = [row[::-1] for row in table]
    width = k_hi - k_lo + 1
    out = array("f", bytes(4 * n_out))
    for i in range(n_out):
        q, r = divmod(i * down, up)
        start = q - k_hi + pad_lo
        out[i] = sum(map(mul, rev[r], xp[start:start + width]))
    return out
