"""Matrix products of many rows (an encoder's 1,500 frames, a prompt) on the numpy backend,
their rows split among Python threads with BLAS held at one thread.

OpenBLAS's own threads meet inside every product and spin while they wait; on a 2-core box
with other work on it each meeting waits for the slowest thread to be scheduled. Whole row
ranges per thread need one hand-off per product (numpy releases the GIL in BLAS), as
backends/cpu/attention.py shares heads. Needs threadpoolctl (the `cpu` extra) and the main thread
(OpenBLAS takes a raised thread count back only from there); otherwise BLAS runs as it is.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reused_arrays


# Fewer rows (decoding steps, short prompts): one BLAS call, BLAS's own threads. (Session 38 tried 33:
# at load 7-9 a 64-token prompt then ran 5x faster on some processes, but at load 3 SmolLM2 Q4_1's prompt
# ran 176 against 252 tok/s, same process, interleaved: back to 256; docs/performance.md.)
MIN_ROWS = 256

_pool: dict[int, ThreadPoolExecutor] = {}
_state: dict[str, object] = {}


def blas_threads():
    """(threadpoolctl controller of numpy's BLAS, its thread count now), or (None, 1)."""
    if "blas" not in _state:
        try:
            from threadpoolctl import ThreadpoolController
            _state["blas"] = ThreadpoolController().select(user_api="blas")
        except ImportError:
            _state["blas"] = None
    blas = _state["blas"]
    if blas is None or not blas.lib_controllers:
        return None, 1
    return blas, max(c.num_threads for c in blas.lib_controllers)


def pool(n):
    """A thread pool of n workers, kept for the process (a new pool per call started threads each time)."""
    return _pool.get(n) or _pool.setdefault(n, ThreadPoolExecutor(n))


def matmul(x, w, out=None):
    """x (m, k) @ w (k, n): a new C-contiguous (m, n) array, or written into out (m, n)."""
    m = x.shape[0]
    if out is None and x.dtype == np.float32 == w.dtype:
        out = reused_arrays.empty((m, w.shape[1]))
    blas, threads = blas_threads() if x.ndim == 2 and m >= MIN_ROWS else (None, 1)
    if threads < 2 or threading.current_thread() is not threading.main_thread():
        return np.matmul(x, w, out=out)
    if out is None:
        out = np.empty((m, w.shape[1]), np.result_type(x, w))
    _shared(blas, threads, m, lambda lo, hi: np.matmul(x[lo:hi], w, out=out[lo:hi]))
    return out


def by_rows(n, rows, x_rows):
    """rows(lo, hi) over [0, n) split among the threads matmul would use for x_rows rows of x (a
    function that releases the GIL: a q8_0 encoder's weight dequantisation, which one thread ran
    while the other waited for its product), else rows(0, n) here."""
    blas, threads = blas_threads() if x_rows >= MIN_ROWS and n >= 2 else (None, 1)
    if threads < 2 or threading.current_thread() is not threading.main_thread():
        rows(0, n)
    else:
        _shared(blas, threads, n, rows)


def _shared(blas, threads, n, rows):
    bounds = [n * i // threads for i in range(threads + 1)]
    workers = pool(threads - 1)
    with blas.limit(limits=1):
        jobs = [workers.submit(rows, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
        rows(bounds[0], bounds[1])  # the first range on this thread
        for job in jobs:
            job.result()
