"""Exact (erf-based) GELU on float32 for the numpy backend, without scipy's erf.

scipy.special.erf on float32 computes in float64 one element at a time: it took
106 ms of the 121 ms GELU costs in one Whisper tiny.en encode (1 thread). Here erf
is the rational approximation Eigen and XNNPACK use for float32 (an odd
polynomial over an even one on x clamped to [-4, 4], where erf rounds to +-1 in
float32), a few float32 ulps from the true erf. GELU(x) = x/2 (1 + erf(x/sqrt 2)).

`gelu(x)` runs a numba kernel when numba is already loaded (tallow's quantised-weight
kernels load it) and $TALLOW_CPU_KERNELS is not "0", else the same polynomial as
numpy array operations. Measured on Whisper tiny's (1500, 1536) fc1 output, one
thread: scipy's erf 24 ms of CPU, the numpy polynomial 12 ms, the numba kernel
0.4 ms. GELU alone does not load numba: importing it and loading the cached
kernel took 0.9 s, more than the kernel saves a short transcription (4 calls per
30 s window). Inputs other than float32 are left to the caller's float64 path
(`gelu` returns None).

NaN stays NaN; +inf gives +inf and -inf NaN (inf * 0), as the float64 formula does.
"""
import math
import os
import sys

import numpy as np

# erf(x) ~= x * P(x^2) / Q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float).
_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
      -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
      -1.42647390514189e-02)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_CLAMP = 4.0

_state: dict[str, object] = {}


def _erf_numpy(x):
    """The approximation as float32 numpy operations (x: float32 array, not modified)."""
    f = np.float32
    z = np.clip(x, f(-_CLAMP), f(_CLAMP))  # np.clip keeps NaN
    z2 = z * z
    p = np.full_like(z2, f(_P[0]))
    for c in _P[1:]:
        p *= z2
        p += f(c)
    q = np.full_like(z2, f(_Q[0]))
    for c in _Q[1:]:
        q *= z2
        q += f(c)
    p *= z
    p /= q
    return p


def _gelu_numpy(x):
    y = _erf_numpy(x * np.float32(_INV_SQRT2))
    y += np.float32(1.0)
    y *= np.float32(0.5)  # halve before multiplying by x: x * 2 overflows near float32's max
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in the float64 formula
        y *= x
    return y


def _build_numba():
    from numba import njit

    f = np.float32
    p0, p1, p2, p3, p4, p5, p6 = (f(c) for c in _P)
    q0, q1, q2, q3, q4 = (f(c) for c in _Q)
    s, lim, half, one = f(_INV_SQRT2), f(_CLAMP), f(0.5), f(1.0)

    # error_model="numpy": no Python ZeroDivisionError check in the loop, whose branch
    # kept LLVM from vectorising it (measured 18 ms -> 0.5 ms on 1500x1536).
    # "contract" lets it use fused multiply-adds (no less exact).
    @njit(cache=True, error_model="numpy", fastmath={"contract"})
    def gelu_kernel(x, out):
        # One flat loop, no branches: LLVM vectorises it. The clamps are selects that
        # keep NaN (a comparison with NaN is false).
        for i in range(x.size):
            v = x[i]
            z = v * s
            z = lim if z > lim else z
            z = -lim if z < -lim else z
            z2 = z * z
            p = ((((((p0 * z2 + p1) * z2 + p2) * z2 + p3) * z2 + p4) * z2 + p5) * z2 + p6) * z
            q = (((q0 * z2 + q1) * z2 + q2) * z2 + q3) * z2 + q4
            out[i] = half * v * (one + p / q)

    return gelu_kernel


def _kernel():
    """The numba kernel, or None: numba not loaded (see above), or TALLOW_CPU_KERNELS=0."""
    if os.environ.get("TALLOW_CPU_KERNELS", "1") == "0" or "numba" not in sys.modules:
        return None
    if "kernel" not in _state:
        try:
            _state["kernel"] = _build_numba()
        except ImportError:
            _state["kernel"] = None
    return _state["kernel"]


def gelu(x):
    """Exact GELU of a float32 array (a new array, same shape), or None for other dtypes."""
    if x.dtype != np.float32:
        return None
    kernel = _kernel()
    if kernel is None:
        return _gelu_numpy(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    kernel(flat, out)
    return out.reshape(x.shape)
