"""The page's entry to the wasm device in Pyodide (as tallow_wgpu.browser is to WebGPU's):

    from tallow.backends.wasm.browser import create_wasm_driver, register_device
    driver = await create_wasm_driver()     # kernels.wasm over a WebAssembly.Memory owned by driver.js
    dev = register_device(driver)           # tallow.Device("wasm") now runs on it

PageWasmBackend is WasmBackend plus from_js_buffer: a weights file's tensors (tallow.io's
direct_tensor over the page's JS buffer or sliced Blob) go into the module's memory in JS
(driver.js's writeFromBuffer / writeFromSlices), never through the Python heap.
"""
from tallow.device import use_backend
from tallow.errors import ShapeError

from .backend import WasmBackend, WasmStorage
from .driver_browser import BrowserWasmDriver, create_wasm_driver

__all__ = ["BrowserWasmDriver", "PageWasmBackend", "create_wasm_driver", "register_device"]


class PageWasmBackend(WasmBackend):
    def from_js_buffer(self, array_buffer, offset, nbytes, dtype):
        """Storage holding nbytes of a JS buffer (or sliced file) at offset, copied in JS: the same
        bytes from_bytes would hold (the wasm device keeps every dtype as its raw bytes)."""
        if not dtype.is_quantized and nbytes % dtype.itemsize:
            raise ShapeError(f"wasm from_js_buffer: {nbytes} bytes is not a whole number of {dtype.name} elements")
        numel = nbytes if dtype.is_quantized else nbytes // dtype.itemsize
        buf = self.driver.alloc_bytes(nbytes)
        if nbytes:
            self.driver.write_from_js(buf, 0, array_buffer, offset, nbytes)
        return WasmStorage(buf, dtype, numel)

    def concat_rows(self, parts, dtype):
        """Contiguous tensors joined one after another (q/k/v and gate/up weights at load time), copied
        inside the memory in JS rather than read back into Python and written again."""
        spans = []
        for st, lay in parts:
            if not lay.is_contiguous():
                return super().concat_rows(parts, dtype)
            if dtype.is_quantized:
                if lay.offset % dtype.block_size:
                    return super().concat_rows(parts, dtype)
                spans.append((st, lay.offset // dtype.block_size * dtype.block_bytes, dtype.nbytes(lay.numel())))
            else:
                spans.append((st, lay.offset * dtype.itemsize, lay.numel() * dtype.itemsize))
        total = sum(n for _, _, n in spans)
        numel = total if dtype.is_quantized else total // dtype.itemsize
        out = WasmStorage(self.driver.alloc_bytes(total), dtype, numel)
        pos = 0
        for st, start, n in spans:
            if n:
                self.driver.copy_bytes(st.buf, start, out.buf, pos, n)
            pos += n
        return out


def register_device(driver):
    """Make tallow.Device("wasm") use `driver` (natively the backend opens a WasmtimeDriver).
    Returns that Device."""
    return use_backend("wasm", PageWasmBackend(driver))
