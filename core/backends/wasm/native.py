"""kernels.wasm run natively with wasmtime (`pip install wasmtime`): the tests' and the bench's way in,
and the start of `device="wasm"` off the page. Arrays are copied into the module's memory at
offsets handed out by a bump allocator (as JS will place weights in its WebAssembly.Memory) and
the kernels are called with those byte offsets.
(numpy is imported where used: this module must import inside Pyodide, tests/test_pyodide.py.)
"""
import atexit
import weakref

from ...errors import DeviceError

PAGE = 65536  # bytes per wasm memory page
ALIGN = 16  # every array starts on a SIMD128 boundary


class Kernels:
    """One instance of kernels.wasm and its memory (grown as arrays are placed)."""

    def __init__(self, path, pages=64):
        try:
            import wasmtime
        except ImportError:
            raise DeviceError("running kernels.wasm natively needs wasmtime: pip install wasmtime") from None
        self._wt = wasmtime
        self.store = wasmtime.Store()
        module = wasmtime.Module.from_file(self.store.engine, path)
        need = next(i.type.limits.min for i in module.imports if i.name == "memory")
        self.memory = wasmtime.Memory(self.store, wasmtime.MemoryType(wasmtime.Limits(max(pages, need), None)))
        self.instance = wasmtime.Instance(self.store, module, [self.memory])
        ex = self.instance.exports(self.store)
        self.next = _aligned(ex["__heap_base"].value(self.store))
        self._fns = {e.name: ex[e.name] for e in module.exports if e.name != "__heap_base"}
        self.table = self.alloc(65536 * 4)
        self("f16_table", self.table)
        _LIVE.add(self)

    def close(self):
        """Free the store and its engine now. At interpreter exit (atexit) this runs before
        wasmtime's own module is torn down: left to garbage collection then, its destructors
        found their ffi gone and printed "Exception ignored in Managed.__del__"."""
        self.store.close()
        self.store.engine.close()

    def __call__(self, name, *args):
        return self._fns[name](self.store, *args)

    def has(self, name):
        return name in self._fns

    def alloc(self, nbytes):
        """The offset of `nbytes` fresh bytes (the memory grows as needed; nothing is freed)."""
        at = self.next
        self.next = _aligned(at + nbytes)
        have = self.memory.size(self.store) * PAGE
        if self.next > have:
            self.memory.grow(self.store, -(-(self.next - have) // PAGE))
        return at

    def put(self, array):
        """Copy a C-contiguous numpy array into fresh memory; returns its offset."""
        import numpy as np
        data = np.ascontiguousarray(array).tobytes()
        at = self.alloc(len(data))
        self.memory.write(self.store, data, at)
        return at

    def get(self, at, shape, dtype):
        """A numpy copy of the array at offset `at`."""
        import numpy as np
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        return np.frombuffer(self.memory.read(self.store, at, at + n), dtype=dtype).reshape(shape).copy()


_LIVE: "weakref.WeakSet[Kernels]" = weakref.WeakSet()


@atexit.register
def _close_live():
    for kernels in list(_LIVE):
        kernels.close()


def _aligned(at):
    return -(-at // ALIGN) * ALIGN
