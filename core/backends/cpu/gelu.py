"""Exact (erf-based) GELU on float32 for the numpy backend, without scipy's erf.

scipy.special.erf on float32 computes in float64 one element at a time: it took
106 ms of the 121 ms GELU costs in one Whisper tiny.en encode (1 thread). Here erf
is the rational approximation Eigen and XNNPACK use for float32 (an odd
polynomial over an even one on x clamped to [-4, 4], where erf rounds to +-1 in
float32), a few float32 ulps from the true erf. GELU(x) = x/2 (1 + erf(x/sqrt 2)).

`gelu(x)` runs a compiled kernel (backends/cpu/kernels/fused_ops.py: the same float32
operations in the same order, so the same bits) once the process uses the CPU
kernels (a quantised model, Whisper on the CPU; not under TALLOW_CPU=numpy),
else the polynomial as numpy array operations. Measured on Whisper tiny's
(1500, 1536) fc1 output, one thread: scipy's erf 24 ms of CPU, the numpy
polynomial 12 ms, the kernel 0.4 ms. GELU alone does not load the kernels.
Inputs other than float32 are left to the caller's float64 path (`gelu` returns None).

NaN stays NaN; +inf gives +inf and -inf NaN (inf * 0), as the float64 formula does.
"""
import numpy as np

from .kernels.codes import ERF_P, ERF_Q, GELU_CLAMP, INV_SQRT2


CHUNK = 16384  # elements per numpy pass (64 KB each temporary: they stay in L2 between passes)


def _erf_numpy(z, t):
    """erf of the float32 chunk z (clamped here, in place) into t; uses z as scratch."""
    f = np.float32
    np.clip(z, f(-GELU_CLAMP), f(GELU_CLAMP), out=z)  # np.clip keeps NaN
    z2 = np.multiply(z, z)
    t.fill(f(ERF_P[0]))
    for c in ERF_P[1:]:
        t *= z2
        t += f(c)
    t *= z
    np.multiply(z2, f(ERF_Q[0]), out=z)
    for c in ERF_Q[1:-1]:
        z += f(c)
        z *= z2
    z += f(ERF_Q[-1])
    t /= z
    return t


def _gelu_numpy(x, out=None):
    """The approximation as float32 numpy operations, CHUNK elements at a time (out may be x).
    Measured on Whisper tiny's (1500, 1536) fc1 output, one thread, busy box, best of 10:
    18 ms as whole-array passes, 10 ms in chunks (the same values bit for bit)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    res = np.empty_like(flat) if out is None else out.reshape(-1)
    f = np.float32
    z = np.empty(min(CHUNK, flat.size), np.float32)
    t = np.empty_like(z)
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in the float64 formula
        for i in range(0, flat.size, CHUNK):
            part = flat[i:i + CHUNK]
            n = part.size
            zc, tc = z[:n], t[:n]
            np.multiply(part, f(INV_SQRT2), out=zc)
            _erf_numpy(zc, tc)
            tc += f(1.0)
            tc *= f(0.5)  # halve before multiplying by x: x * 2 overflows near float32's max
            tc *= part
            res[i:i + n] = tc
    return res.reshape(x.shape)


def _kernel():
    """The compiled kernels (out of place, in place) once this process uses the CPU kernels
    (backends/cpu/runtime/kernel_calls.py: a quantised model, or Whisper on the CPU), else None. GELU alone
    never loads them, and TALLOW_CPU=numpy turns them off."""
    from .runtime import kernel_calls
    mod = kernel_calls.decode_kernels()
    return None if mod is None else (mod.gelu, mod.gelu_in_place)


def gelu(x, out=None):
    """Exact GELU of a float32 array, or None for other dtypes. out: a contiguous float32 array
    of x's size to write into (x itself for in place); default a new array of x's shape."""
    if x.dtype != np.float32:
        return None
    flat = np.ascontiguousarray(x).reshape(-1)
    res = np.empty_like(flat) if out is None else out.reshape(-1)
    overlap = np.shares_memory(flat, res)
    if overlap and flat.ctypes.data != res.ctypes.data:  # a partial overlap: through a copy
        res[:] = gelu(flat.copy()).reshape(-1)
        return res.reshape(x.shape)
    kernels = _kernel()
    if kernels is None:
        return _gelu_numpy(flat, res).reshape(x.shape)
    kernel, in_place = kernels
    if overlap:
        in_place(res)
    else:
        kernel(flat, res)
    return res.reshape(x.shape)
