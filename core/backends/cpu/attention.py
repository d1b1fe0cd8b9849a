"""Many-query attention for the numpy backend (Whisper's encoder: 1500x1500 scores per
head; an LLM's prompt prefill), blocked so the scores stay in cache.

softmax(q k^T * scale + mask) v, one head and BLOCK queries at a time: the
block's scores (BLOCK x tk float32: 768 KB for Whisper) are written by BLAS,
then max, subtract, exp and sum run over them while they are still in L2 (one
compiled call where the CPU kernels are in use: fused_ops.softmax_rows),
and the division by the row sums is done on the (BLOCK x d) output instead of
the scores. Doing all heads at once (the plain formula) makes each of those passes a
trip through a 54 MB array for Whisper tiny.

Threads: the heads are shared out between Python threads (numpy releases the GIL
in BLAS and its ufuncs), as many as BLAS has, with BLAS held at one thread for
the call. Each product here is small (128 x 64 x 1500), and OpenBLAS's own threads
cost a hand-off per product: on a 2-core box with other work on it, 2 BLAS threads
made one layer's attention slower than 1 thread; whole heads per thread need no
hand-off. This needs threadpoolctl (the `cpu` extra) and the main thread
(OpenBLAS takes a raised thread count back only from there, see
models/decode_threads.py); otherwise one thread runs the heads with BLAS as it is.

Same broadcasting as np.matmul over the leading (batch, head) dimensions, so a
single key/value head serves many query heads.
"""
import threading

import numpy as np

from .runtime.blas_rows import blas_threads, pool

BLOCK = 128  # query rows per block (measured 32-512 on Whisper tiny's encoder, 1 and 2 threads: 128 best)
# Fewer queries (decoding steps: the decode kernels take up to 8 rows): the caller's plain path. Prompts of
# 9-127 queries take the blocked path too: the plain path's batched np.matmul hands each head's small
# product to OpenBLAS's threads (py-spy, Qwen2.5-1.5B shape, 64-token prompt, one thread, load 8-10: 36%
# of samples in OpenBLAS's exec_blas / inner_thread, 1% in its sgemm); blocked, same run: 13.4 against
# 5.4 tok/s wall, 2 threads (session 38, docs/cpu-kernels.md).
MIN_QUERIES = 9
# A head's q k^T multiply-adds below which the heads run on this thread (BLAS at one thread): a
# 64-token prompt's 12 heads of 64 x 64 scores (d 128) took 1.23 ms shared by 2 threads and 0.68 ms on one
THREAD_MIN_MACS = 1 << 21


def attention(q, k, v, mask, scale, causal):
    """q (..., tq, d), k (..., tk, d), v (..., tk, dv), mask None or broadcastable to
    (..., tq, tk) (added to the scores); causal: query i sees keys up to i + tk - tq."""
    tq, tk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        lead = np.broadcast_shapes(lead, mask.shape[:-2])
        mask = np.broadcast_to(mask, lead + (tq, tk))
    dtype = np.result_type(q, k, v) if mask is None else np.result_type(q, k, v, mask)
    heads = int(np.prod(lead))
    # Broadcast views (no copies), indexed per head by its position in `lead`.
    qs = np.broadcast_to(q, lead + q.shape[-2:])
    ks = np.broadcast_to(k, lead + k.shape[-2:])
    vs = np.broadcast_to(v, lead + v.shape[-2:])
    out = np.empty((heads, tq, dv), dtype)
    sc = np.asarray(scale, dtype)
    kernel = _softmax_kernel()

    def one_head(h):
        at = np.unravel_index(h, lead) if lead else ()
        qh, kt, vh, mh = qs[at], ks[at].T, vs[at], None if mask is None else mask[at]
        scores = np.empty((min(BLOCK, tq), tk), dtype)
        totals = np.empty((min(BLOCK, tq), 1), np.float32)
        for i0 in range(0, tq, BLOCK):
            i1 = min(i0 + BLOCK, tq)
            s = scores[: i1 - i0]
            np.matmul(qh[i0:i1] * sc, kt, out=s)  # scale folded into the (rows x d) queries
            if mh is not None:
                s += mh[i0:i1]
            if causal:
                banned = np.arange(tk)[None, :] > np.arange(i0, i1)[:, None] + (tk - tq)
                s[banned] = -np.inf
            if kernel is not None and dtype == np.float32:  # the max, exp and sum in one compiled call
                total = totals[: i1 - i0]
                kernel(s, total.reshape(-1))
            else:
                s -= np.max(s, axis=-1, keepdims=True)
                np.exp(s, out=s)
                total = np.sum(s, axis=-1, keepdims=True)
            o = out[h, i0:i1]
            np.matmul(s, vh, out=o)
            o /= total

    blas, threads = blas_threads()
    if threads > 1 and heads > 1 and threading.current_thread() is threading.main_thread():
        with blas.limit(limits=1):
            if tq * tk * q.shape[-1] < THREAD_MIN_MACS:  # small heads: the GIL serialises their numpy calls
                for h in range(heads):
                    one_head(h)
            else:
                list(pool(min(threads, heads)).map(one_head, range(heads)))
    else:
        for h in range(heads):
            one_head(h)
    return out.reshape(lead + (tq, dv))


def _softmax_kernel():
    """fused_ops.softmax_rows once this process uses the CPU kernels (Whisper on the CPU,
    a quantised model: backends/cpu/runtime/kernel_calls.py), else None: numpy's four passes over each block.
    Measured on a 128 x 1,500 block: 390 -> 180 us; exp within 1e-7 of numpy's."""
    from .runtime import kernel_calls
    mod = kernel_calls.decode_kernels()
    return None if mod is None else mod.softmax_rows
