"""Large float32 results of the numpy backend's many-row ops (an encoder's 1,500 frames, a
prompt) in memory reused from earlier results, rather than fresh pages each time.

tallow.settings.tune_process fixes glibc's mmap threshold at 1 MB (for peak RSS), so every
result from 1 MB up is mapped fresh and unmapped when freed, and its pages fault in again at
the next op: Whisper tiny's generic encoder makes about 40 MB of such results a layer, and the
faults cost it 12-20% of its CPU time (docs/performance.md). Here a buffer this module made is
handed out again once nothing refers to it (its reference count says so: every numpy view of
it holds it as its base), up to MAX_BYTES in all; `release()` drops the free ones, as a
decoding step starts (kernel_calls), so a model's steady memory is what it was.
"""
import sys
import threading

import numpy as np

MIN_BYTES = 1 << 20  # smaller results come from malloc's heap anyway
MAX_BYTES = 64 << 20  # memory held here at most, lent and free

_held: list = []  # uint8 buffers made here
_lock = threading.Lock()
_FREE_REFS = 3  # references to a free buffer in _free_of: _held's, the loop's, getrefcount's argument


def empty(shape):
    """An uninitialised C-contiguous float32 array of `shape`."""
    n = 4 * int(np.prod(shape))
    if n < MIN_BYTES:
        return np.empty(shape, np.float32)
    with _lock:  # (a buffer is free until its view exists: find and view it under the lock)
        buf = _free_of(n)
        if buf is None:
            if sum(b.nbytes for b in _held) + n > MAX_BYTES:
                return np.empty(shape, np.float32)
            buf = np.empty(n, np.uint8)
            _held.append(buf)
        return buf.view(np.float32).reshape(shape)


def _free_of(n):
    for buf in _held:
        if buf.nbytes == n and sys.getrefcount(buf) == _FREE_REFS:
            return buf
    return None


def release():
    """Drop the buffers nothing refers to (their memory goes back to the system)."""
    if not _held:
        return
    with _lock:
        _held[:] = [b for b in _held if sys.getrefcount(b) > _FREE_REFS]
