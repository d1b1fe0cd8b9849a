"""The wasm device's driver in the page (Pyodide): the driver protocol's wasm-call form
(driver.WasmDriver) over js/driver.js, which owns kernels.wasm's WebAssembly.Memory, so weights
can go from a Blob's slices into it in JS (write_from_slices) as they go to GPU buffers on
WebGPU, and a replay is one JS call of the module's `run`.

    driver = await create_wasm_driver()      # the kernels.wasm this package carries
"""
import sys
from importlib import resources

from ...errors import DeviceError
from .driver import WasmDriver

_FACTORY = None


def _js():
    if sys.platform != "emscripten":
        raise DeviceError("the browser wasm driver runs only inside Pyodide; natively use WasmtimeDriver")
    import js
    import pyodide.ffi as ffi
    return js, ffi


async def create_wasm_driver():
    global _FACTORY
    js, ffi = _js()
    package = resources.files("tallow.backends.wasm")
    wasm = package.joinpath("kernels.wasm")
    if not wasm.is_file():
        raise DeviceError("the wasm device needs kernels.wasm, which this tallow wheel lacks: "
                          "build the wheel after `make wasm`")
    if _FACTORY is None:
        _FACTORY = js.Function(package.joinpath("driver.js").read_text())()
    return BrowserWasmDriver(await _FACTORY(ffi.to_js(wasm.read_bytes())))


class BrowserWasmDriver(WasmDriver):
    name = "browser"

    def __init__(self, js_kernels):
        _, self._ffi = _js()
        self._js = js_kernels
        self.table = int(js_kernels.table)
        # bytes written into the memory from Python (the Pyodide heap) and straight from JS buffers
        self.bytes_from_python = 0
        self.bytes_from_js = 0
        self._start()

    def _alloc_range(self, nbytes):
        try:
            return int(self._js.alloc(nbytes))  # fresh memory is zero
        except self._ffi.JsException as e:  # driver.js: past wasm32's 4 GiB, or the browser refused to grow
            raise DeviceError(f"the wasm device's memory cannot take {nbytes} more bytes: {e}") from None

    def _memory_bytes(self):
        return int(self._js.memoryBytes())

    def _read(self, at, nbytes):
        return self._js.read(at, nbytes).to_bytes()

    def _write(self, at, data):
        self._js.write(at, self._ffi.to_js(data))
        self.bytes_from_python += len(data)

    def _zero(self, at, nbytes):
        self._js.zero(at, nbytes)

    def copy_bytes(self, src, src_offset, dst, dst_offset, nbytes):
        """nbytes from one buffer to another inside the memory, in JS."""
        to, at = self._range(dst, dst_offset, nbytes, "copy"), self._range(src, src_offset, nbytes, "copy")
        self._js.copy(to, at, nbytes)

    def _call(self, export, args):
        self._js.call(export, self._ffi.to_js(list(args)))

    async def write_from_slices(self, buf, byte_offset, js_file, src_offset, nbytes):
        """nbytes of a JS sliced file (worker.mjs's SlicedFile) from src_offset into buf, in JS."""
        await self._js.writeFromSlices(self._range(buf, byte_offset, nbytes, "write"), js_file, src_offset, nbytes)
        self.bytes_from_js += nbytes

    def write_from_js(self, buf, byte_offset, js_data, src_offset, nbytes):
        """nbytes of a JS ArrayBuffer / typed array, or of a sliced file, from src_offset into buf, in JS
        (the page's weights: tallow.io's direct_tensor through the page backend's from_js_buffer). A
        sliced file is read asynchronously: Python waits through run_sync (entered via callPromising)."""
        at = self._range(buf, byte_offset, nbytes, "write")
        if hasattr(js_data, "byteLength"):
            self._js.writeFromBuffer(at, js_data, src_offset, nbytes)
        else:
            if not self._ffi.can_run_sync():
                raise DeviceError("copying a sliced file into the wasm memory needs Python entered through "
                                  "callPromising (JSPI)")
            self._ffi.run_sync(self._js.writeFromSlices(at, js_data, src_offset, nbytes))
        self.bytes_from_js += nbytes
