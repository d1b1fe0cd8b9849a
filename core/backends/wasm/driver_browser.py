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
        self._start()

    def _alloc_range(self, nbytes):
        try:
            return int(self._js.alloc(nbytes))  # fresh memory is zero
        except self._ffi.JsException as e:  # driver.js: past wasm32's 4 GiB, or the browser refused to grow
            raise DeviceError(f"the wasm device's memory cannot take {nbytes} more bytes: {e}") from None

    def _read(self, at, nbytes):
        return self._js.read(at, nbytes).to_bytes()

    def _write(self, at, data):
        self._js.write(at, self._ffi.to_js(data))

    def _call(self, export, args):
        self._js.call(export, self._ffi.to_js(list(args)))

    async def write_from_slices(self, buf, byte_offset, js_file, src_offset, nbytes):
        """nbytes of a JS sliced file (worker.mjs's SlicedFile) from src_offset into buf, in JS."""
        await self._js.writeFromSlices(self._range(buf, byte_offset, nbytes, "write"), js_file, src_offset, nbytes)
