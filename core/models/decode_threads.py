"""One CPU thread for token-by-token decoding.

A decoding step multiplies one row by each weight matrix: Whisper tiny's are 384
wide, a few microseconds of work, so a second BLAS (or numba) thread only adds a
hand-off per product, and when the other core is busy (a shared box, an edge box
also running an LLM) every hand-off waits for the scheduler to run the helper
thread. Measured on a 2-core box with other work on it: the decoder of Whisper
tiny.en on jfk.wav took 1.1-3.9 s with 2 OpenBLAS threads and 0.28-0.70 s with
one. The encoder's large products keep the threads.

`one_thread()` limits BLAS (through threadpoolctl, when installed) and numba's
parallel kernels (when numba is loaded) for the `with` block, and restores them.
Without either library it does nothing: the results are the same, only the speed differs.
BLAS's thread count is one setting for the whole process, and OpenBLAS takes a raise
back only from the main thread (measured: OpenBLAS 0.3.31 with pthreads), so only a
decode in the main thread limits BLAS; one in another Python thread limits numba
alone (numba's count is per thread).
"""
import sys
import threading
from contextlib import contextmanager


@contextmanager
def one_thread():
    limits = None
    if threading.current_thread() is threading.main_thread():
        try:
            from threadpoolctl import threadpool_limits
            limits = threadpool_limits(1, user_api="blas")
        except ImportError:
            pass
    numba = sys.modules.get("numba")
    numba_threads = numba.get_num_threads() if numba is not None else None
    if numba_threads is not None:
        numba.set_num_threads(1)
    try:
        yield
    finally:
        if numba_threads is not None:
            numba.set_num_threads(numba_threads)
        if limits is not None:
            limits.restore_original_limits()
