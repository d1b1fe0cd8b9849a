"""The activations the K-quant decode kernels compute with (q4_k, q5_k, q6_k), in numpy: their
16-bit activation blocks requantised to 8 bits as the blocks are read (x8 = (127 x16 + 2^14) >> 15,
x86's pmulhrsw rounding; scale d * 32768 / 127)."""
import numpy as np

K_QUANTS = ("q4_k", "q5_k", "q6_k")


def requantised(qs):
    """int16 activation values -> the kernels' int8 ones (as int64)."""
    return (qs.astype(np.int64) * 127 + (1 << 14)) >> 15


def kquant_product(w, qs, d):
    """(the kernels' product x . w.T in float64, the bound of its difference from the 16-bit
    activations' product) for the dequantised (n, k) K-quant matrix w (float64) and the 16-bit
    activations qs (m, k) with their block scales d (m, k / 32)."""
    m, k = qs.shape
    d8 = d.astype(np.float64) * 32768 / 127
    x8 = (requantised(qs).reshape(m, -1, 32) * d8[..., None]).reshape(m, k)
    # each int8 value is within half its step d8 / 2 of the 16-bit one
    bound = (np.abs(w).reshape(w.shape[0], k // 32, 32).sum(axis=2) @ (d8 / 2).T).T
    return x8 @ w.T, bound
