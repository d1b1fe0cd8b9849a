"""The wasm device's native driver: kernels.wasm under wasmtime (native.Kernels), speaking the
driver protocol's wasm-call form (driver.WasmDriver; core/backends/driver_protocol.py). For the
tests, the conformance suite and edge boxes without numba; the page's twin is driver_browser.py.

    driver = WasmtimeDriver()                      # the shipped kernels.wasm, or path=
"""
import ctypes
import os

from ...errors import DeviceError
from .driver import WasmDriver
from .native import PAGE, Kernels

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.wasm")


class WasmtimeDriver(WasmDriver):
    name = "wasmtime"

    def __init__(self, path=None):
        path = path or SHIPPED
        if not os.path.exists(path):
            raise DeviceError(f"the wasm device needs kernels.wasm ({path} is missing): run `make wasm`, "
                              "or install tallow from a wheel, which carries it")
        self.kernels = Kernels(path)
        self.table = self.kernels.table
        self._start()

    def _alloc_range(self, nbytes):
        try:
            return self.kernels.alloc(nbytes)  # fresh memory is zero
        except self.kernels._wt.WasmtimeError as e:  # past wasm32's 4 GiB, or the host refused to grow
            raise DeviceError(f"the wasm device's memory cannot take {nbytes} more bytes: {e}") from None

    def _memory_bytes(self):
        return self.kernels.memory.size(self.kernels.store) * PAGE

    def _read(self, at, nbytes):
        return bytes(self.kernels.memory.read(self.kernels.store, at, at + nbytes))

    def _zero(self, at, nbytes):
        """A reused range zeroed in place (memset on the memory's bytes: no Python bytes object)."""
        if at < 0 or at + nbytes > self._memory_bytes():
            raise DeviceError(f"the wasm device cannot zero bytes [{at}, {at + nbytes}) of its memory")
        memory = self.kernels.memory
        ctypes.memset(ctypes.addressof(memory.data_ptr(self.kernels.store).contents) + at, 0, nbytes)

    def _write(self, at, data):
        self.kernels.memory.write(self.kernels.store, data, at)

    def _call(self, export, args):
        self.kernels(export, *args)
