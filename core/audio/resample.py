"""Band-limited sample-rate conversion: a polyphase Kaiser-windowed-sinc filter.

The design is scipy.signal.resample_poly's default, so results agree with it:
for a rate change up/down (in lowest terms) the low-pass FIR has
2 * 10 * max(up, down) + 1 taps, cutoff at the lower of the two Nyquist
frequencies, a Kaiser window with beta 5, unit DC gain per output sample, and is
applied zero-phase with zeros outside the signal. numpy when present, pure
Python otherwise (same filter, same result to float rounding).

The work is bounded whatever the rates: a ratio whose lowest terms exceed
MAX_RATIO_TERMS (7919 Hz -> 16 kHz is 16000/7919) is replaced by its closest
fraction with terms up to that bound (1679/831: 8e-8 off, 0.9 ms over 3 hours),
so the filter never has more than 2 * 10 * 2000 + 1 taps. Resampler converts a
stream chunk by chunk with the same result as one call on the whole signal.
"""
import math
from array import array
from fractions import Fraction
from functools import lru_cache
from operator import mul

from ..errors import Error
from .wav import numpy_or_none

HALF_TAPS_PER_RATE = 10
MAX_RATIO_TERMS = 2000  # every common rate pair (44100/16000 = 441/160) is exact below this
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


def rate_ratio(orig_sr, target_sr):
    """(up, down): target/orig in lowest terms, or its closest fraction with both
    terms at most MAX_RATIO_TERMS; an Error when the rates differ by more than that."""
    if int(orig_sr) != orig_sr or int(target_sr) != target_sr or orig_sr <= 0 or target_sr <= 0:
        raise Error(f"resample: sample rates must be positive integers, got {orig_sr} -> {target_sr}")
    ratio = Fraction(int(target_sr), int(orig_sr))
    if not 1 / MAX_RATIO_TERMS <= ratio <= MAX_RATIO_TERMS:
        raise Error(f"resample: cannot convert {orig_sr} Hz to {target_sr} Hz: the rates differ by more than a "
                    f"factor of {MAX_RATIO_TERMS}")
    if max(ratio.numerator, ratio.denominator) > MAX_RATIO_TERMS:
        # Approximate the ratio that is below 1, so that its larger term is the bounded denominator.
        if ratio > 1:
            inv = (1 / ratio).limit_denominator(MAX_RATIO_TERMS)
            ratio = Fraction(inv.denominator, inv.numerator)
        else:
            ratio = ratio.limit_denominator(MAX_RATIO_TERMS)
    return ratio.numerator, ratio.denominator


@lru_cache(maxsize=8)  # a service resamples many files at the same few rates
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
        table.append(tuple(row))
    return tuple(table), k_lo, k_hi


def resample(samples, orig_sr, target_sr=16000, use_numpy=None):
    """Resample 1-D float samples from orig_sr to target_sr (Hz, integers).
    Returns an array('f') (pure Python) or a float32 numpy array (numpy path)."""
    r = Resampler(orig_sr, target_sr, use_numpy=use_numpy)
    head, tail = r.process(samples), r.finish()
    if r.np is not None:
        return np_concat(r.np, [head, tail])
    head.extend(tail)
    return head


def np_concat(np, parts):
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


class Resampler:
    """Streaming polyphase resampling: process(chunk) returns the output samples that
    chunk completes, finish() the rest; together exactly what resample() gives for
    the whole signal (each output is the same sum in the same order). It keeps only
    the filter's reach of input, so memory does not grow with the stream."""

    def __init__(self, orig_sr, target_sr=16000, use_numpy=None):
        self.up, self.down = rate_ratio(orig_sr, target_sr)
        self.orig_sr, self.target_sr = int(orig_sr), int(target_sr)
        self.np = numpy_or_none(use_numpy)
        self.identity = self.up == self.down
        self.n_in = 0  # input samples seen
        self.m = 0  # next output sample index
        if self.identity:
            return
        table, self.k_lo, self.k_hi = _phase_table(self.up, self.down)
        # buf holds input indices [base, base + len(buf)); zeros stand in before index 0
        self.base = -self.k_hi
        if self.np is not None:
            self.table = self.np.asarray(table)
            self.buf = self.np.zeros(self.k_hi)
        else:
            self.rev = [row[::-1] for row in table]  # reversed: lines up with a forward slice of input
            self.buf = [0.0] * self.k_hi

    def _out_len(self):
        """Output length for the input seen so far, from the true rates (ceil, as resample_poly)."""
        return -(-self.n_in * self.target_sr // self.orig_sr)

    def process(self, samples):
        if self.identity:
            self.n_in += len(samples)
            return self.np.asarray(samples, self.np.float32).copy() if self.np is not None else array("f", samples)
        if self.np is not None:
            x = self.np.asarray(samples, dtype=self.np.float64).ravel()
            self.buf = self.np.concatenate([self.buf, x])
        else:
            self.buf.extend(samples)
        self.n_in += len(samples)
        # output m needs input up to q - k_lo (q = m * down // up): stop where the input ends
        last_q = self.n_in - 1 + self.k_lo
        stop = -(-(last_q + 1) * self.up // self.down) if last_q >= 0 else 0
        return self._emit(min(stop, self.n_in * self.target_sr // self.orig_sr))

    def finish(self):
        """The outputs that need the zeros after the end of the input."""
        if self.identity:
            return self.np.zeros(0, self.np.float32) if self.np is not None else array("f")
        stop = self._out_len()
        if stop > self.m:
            need = (stop - 1) * self.down // self.up - self.k_lo + 1  # one past the last input index used
            pad = max(0, need - (self.base + len(self.buf)))
            if self.np is not None:
                self.buf = self.np.concatenate([self.buf, self.np.zeros(pad)])
            else:
                self.buf.extend([0.0] * pad)
        return self._emit(stop)

    def _emit(self, stop):
        start, self.m = self.m, max(self.m, stop)
        out = self._numpy(start, self.m) if self.np is not None else self._python(start, self.m)
        keep = self.m * self.down // self.up - self.k_hi - self.base  # the first input the next output needs
        if keep > 0:
            self.buf = self.buf[keep:]
            self.base += keep
        return out

    def _numpy(self, start, stop):
        np = self.np
        m = np.arange(start, stop, dtype=np.int64) * self.down
        q, r = m // self.up, m % self.up
        y = np.zeros(stop - start)
        for j, k in enumerate(range(self.k_lo, self.k_hi + 1)):  # y[m] = sum_k table[r, k] * x[q - k]
            y += self.table[r, j] * self.buf[q - k - self.base]
        return y.astype(np.float32)

    def _python(self, start, stop):
        out = array("f", bytes(4 * (stop - start)))
        up, down, rev, buf = self.up, self.down, self.rev, self.buf
        width = self.k_hi - self.k_lo + 1
        offset = -self.k_hi - self.base
        for i in range(start, stop):
            q, r = divmod(i * down, up)
            s = q + offset
            out[i - start] = sum(map(mul, rev[r], buf[s:s + width]))
        return out
