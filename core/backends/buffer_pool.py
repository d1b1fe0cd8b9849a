"""A pool of GPU buffers, reused by size class: the buffer pool of every GPU backend
(tallow.backends.gpu_backend.GpuBackend; wgpu, and CUDA/Metal through the kernel backend).

Making a GPU buffer costs a driver call (an ObjC call on Metal, a JS round trip in the
browser); inference makes the same few sizes over and over. Freed buffers wait in a free list
for their size class and dtype (the wgpu backend asks for bytes; kernel drivers make typed
buffers). Sizes round up to a power of two below 1 MiB and to a multiple of 1 MiB above, so
reuse is likely but the waste stays bounded. The pool keeps at most `max_cached` bytes idle;
beyond that freed buffers are dropped (never destroyed: recorded but unsubmitted work may still
use them, and the driver keeps them alive until it is done). A pool with max_cached=0 rounds
nothing and keeps nothing: for a driver that pools its own memory (CuPy's memory pool).

Reusing a buffer is safe because launches run in the order they were issued, and a driver
orders a write after the work issued before it. A reused buffer is not zeroed: the backends
write every element of a new storage before they read it.
"""

from tallow.dtypes import u8

MIB = 1 << 20


def size_class(nbytes):
    nbytes = max(nbytes, 8)  # the widest element: a class holds whole elements of every dtype
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

    def acquire(self, nbytes, dtype=u8):
        """A buffer of at least nbytes (8 at least) of dtype, as driver.alloc makes it;
        returns (buffer, capacity in bytes)."""
        if not self.max_cached:
            self.misses += 1
            return self.driver.alloc(dtype, nbytes if dtype.is_quantized else nbytes // dtype.itemsize), nbytes
        cap = 1 << (nbytes - 1).bit_length() if 8 < nbytes < MIB else size_class(nbytes)  # size_class, inlined
        free = self._free.get((dtype, cap))
        if free:
            self.hits += 1
            self.cached -= cap
            return free.pop(), cap
        self.misses += 1
        return self.driver.alloc(dtype, cap if dtype.is_quantized else cap // dtype.itemsize), cap

    def release(self, buf, cap, dtype=u8):
        if self.cached + cap > self.max_cached:
            return
        self._free.setdefault((dtype, cap), []).append(buf)
        self.cached += cap

    def clear(self):
        self._free.clear()
        self.cached = 0

