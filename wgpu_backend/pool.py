"""A pool of GPU storage buffers, reused by size class.

Creating a GPU buffer costs a driver call (and, in the browser, a JS round
trip); inference allocates the same few sizes over and over. Freed buffers
wait in a free list for their size class. Sizes round up to a power of two
below 1 MiB and to a multiple of 1 MiB above, so reuse is likely but the
waste stays bounded. The pool keeps at most `max_cached` bytes idle; beyond
that freed buffers are dropped (never destroy()ed: recorded but unsubmitted
work may still use them, and the driver keeps them alive until it is done).

Reusing a buffer inside one command encoder is safe (dispatches are ordered);
uploads into a reused buffer are ordered by the driver, which submits pending
work before any queue write.
"""

from tallow.dtypes import u8

MIB = 1 << 20


def size_class(nbytes):
    nbytes = max(nbytes, 4)
    if nbytes < MIB:
        return 1 << (nbytes - 1).bit_length()
    return (nbytes + MIB - 1) // MIB * MIB


class BufferPool:
    def __init__(self, driver, max_cached=256 * MIB):
        self.driver = driver
        self.max_cached = max_cached
        self._free = {}
        self.cached = 0  # idle bytes held
        self.hits = 0
        self.misses = 0

    def acquire(self, nbytes):
        """A buffer of at least nbytes (4 at least); returns (buffer, capacity)."""
        cap = size_class(nbytes)
        free = self._free.get(cap)
        if free:
            self.hits += 1
            self.cached -= cap
            return free.pop(), cap
        self.misses += 1
        return self.driver.alloc(u8, cap), cap  # buffers hold bytes: the backend keeps dtypes

    def release(self, buf, cap):
        if self.cached + cap > self.max_cached:
            return
        self._free.setdefault(cap, []).append(buf)
        self.cached += cap

    def clear(self):
        self._free.clear()
        self.cached = 0
