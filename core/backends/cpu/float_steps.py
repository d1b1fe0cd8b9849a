"""A float model's decoding step on the CPU kernels (Whisper's decoder): the numpy backend's
matmul / matmul_bias, GELU, embedding lookup and attention over many keys each as one kernel
call that a capture records (runtime/capture.py), so the step replays as a program
(runtime/step_program.py) as a quantised LLM's does.

* products of up to F16_MAX_ROWS rows by a float32 matrix stored exactly in f16 (f16_copies.py):
  kernel_calls.f16_matmul, half the bytes of float32 read per step, bias added in the kernel;
* GELU (exact) into a new array: fused_ops.gelu;
* an embedding lookup on a float32 table: float_rows.take_rows, its ids checked at each replay;
* attention of a few query rows over more keys than the cache kernel takes, unmasked (the
  decoder's cross-attention over the audio's 1,500 frames): fused_ops.cross_attention_rows.

Each returns None where it does not apply; the backend then takes its numpy path, and a capture
refuses the step (it decodes eagerly). The kernels must be in use (kernel_calls.decode_kernels()).
"""
import numpy as np

from .runtime import kernel_calls, reused_arrays

# Up to this many rows a matrix stored exactly in f16 is multiplied by the f16 kernel: each
# weight read once for all rows. From a prompt's tens of rows on, BLAS's float32 product is faster.
F16_MAX_ROWS = 8


def weight_rows(st, lw):
    """(offset, n, k) when the (k, n) operand lw is the transpose of a C-contiguous (n, k) matrix
    in st (a Linear's weight.t()), else None."""
    if len(lw.shape) != 2:
        return None
    k, n = lw.shape
    if lw.strides != (1, k) and not (n == 1 and lw.strides[0] == 1):
        return None
    return lw.offset, n, k


def product(x, st, lw, bias, rec):
    """x (m, k) float32 view times the (k, n) operand (st, lw) plus bias (n,) or None, as an
    (m, n) array, or None (too many rows, not a transposed matrix, or not exactly f16)."""
    if x.ndim != 2 or x.shape[0] > F16_MAX_ROWS or st.dtype != np.float32:
        return None
    where = weight_rows(st, lw)
    if where is None:
        return None
    from .f16_copies import exact_f16
    bits = exact_f16(st, *where)
    if bits is None:
        return None
    reused_arrays.release()  # a decoding step: the window's large results kept for reuse go
    return kernel_calls.f16_matmul(x, bits, bias, record=rec)


def gelu(x, rec):
    """GELU of the flat float32 array x as a new array (the kernel's bits: gelu.py's)."""
    out = np.empty_like(x) if rec is not None else reused_arrays.empty(x.shape)
    dec = kernel_calls.decode_kernels()
    dec.gelu(x, out)
    if rec is not None:
        rec(dec.gelu, x, out)
    return out


def take_rows(table, ids, rec):
    """The rows ids (1-D int64) of the float32 table (n, k), C-contiguous, or None."""
    if table.dtype != np.float32 or table.ndim != 2 or not table.flags.c_contiguous or ids.dtype != np.int64:
        return None
    return kernel_calls.take_rows(table, ids.reshape(-1), record=rec)


def cross_attention(q, k, v, scale, rec):
    """softmax(q k^T * scale) v for q (b, h, t, d) over k (bk, h, tk, d), v (bk, h, tk, dv), or
    None unless all are C-contiguous float32 (k and v batch-broadcast views read as bk = 1)."""
    if k.shape[0] > 1 and k.strides[0] == 0 and v.strides[0] == 0:
        k, v = k[:1], v[:1]  # one audio's keys for every beam
    arrays = (q, k, v)
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
        return None
    if k.shape[0] not in (1, q.shape[0]) or k.shape[1] != q.shape[1] or v.shape[:3] != k.shape[:3]:
        return None
    return kernel_calls.cross_attention(q, k, v, scale, record=rec)
