"""Pure-Python FFT for any length (mixed radix, decimation in time) and the
power spectrum of a real frame via a half-length complex FFT.

Whisper's frames are 400 samples: the real 400-point transform is one complex
200-point FFT (200 = 2*2*2*5*5) plus an untangling pass. numpy's rfft is used
instead whenever numpy is present; this is the fallback for Pyodide without it.
"""
import cmath
import math
from functools import lru_cache
from operator import mul


def _smallest_factor(n):
    for p in (2, 3, 5, 7):
        if n % p == 0:
            return p
    p = 11
    while p * p <= n:
        if n % p == 0:
            return p
        p += 2
    return n


@lru_cache(maxsize=None)
def _twiddles(n, p):
    """W_n^(r*k) for r in 1..p-1, k in 0..n/p-1, and the p x p DFT matrix."""
    m = n // p
    tw = [[cmath.exp(-2j * math.pi * r * k / n) for k in range(m)] for r in range(1, p)]
    dft = [[cmath.exp(-2j * math.pi * r * s / p) for r in range(p)] for s in range(p)]
    return tw, dft


@lru_cache(maxsize=None)
def _dft_matrix(n):
    return [[cmath.exp(-2j * math.pi * k * j / n) for j in range(n)] for k in range(n)]


def fft(x):
    """DFT of a list of complex numbers: X[k] = sum_n x[n] exp(-2 pi i k n / N)."""
    n = len(x)
    if n <= 1:
        return list(x)
    p = _smallest_factor(n)
    if p == n:  # a prime length: direct DFT
        return [sum(map(mul, row, x)) for row in _dft_matrix(n)]
    subs = [fft(x[r::p]) for r in range(p)]
    tw, dft = _twiddles(n, p)
    twisted = [subs[0]] + [[w * v for w, v in zip(tw[r - 1], subs[r])] for r in range(1, p)]
    if p == 2:
        a, b = twisted
        return [u + v for u, v in zip(a, b)] + [u - v for u, v in zip(a, b)]
    out = []
    if p == 5:  # unrolled: Whisper's 200-point transform is mostly radix 5
        for s in range(5):
            _, c1, c2, c3, c4 = dft[s]
            out.extend([a + c1 * b + c2 * c + c3 * d + c4 * e for a, b, c, d, e in zip(*twisted)])
        return out
    for s in range(p):
        row = dft[s]
        out.extend(sum(c * v for c, v in zip(row, vals)) for vals in zip(*twisted))
    return out


@lru_cache(maxsize=None)
def _untangle(n):
    """exp(-2 pi i k / n) for k in 0..n/2, used to split a packed real FFT."""
    return [cmath.exp(-2j * math.pi * k / n) for k in range(n // 2 + 1)]


def rfft_power(frame):
    """|rfft(frame)|^2 for a real frame of even length N: N/2 + 1 values."""
    n = len(frame)
    half = n // 2
    z = fft([complex(a, b) for a, b in zip(frame[0::2], frame[1::2])])
    z.append(z[0])
    w = _untangle(n)
    out = []
    for k in range(half + 1):
        zk, zc = z[k], z[half - k].conjugate()
        even = (zk + zc) * 0.5
        odd = (zk - zc) * -0.5j
        v = even + w[k] * odd
        out.append(v.real * v.real + v.imag * v.imag)
    return out
