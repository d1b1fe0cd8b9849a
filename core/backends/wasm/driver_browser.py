"""The wasm device's driver in the page (Pyodide): the driver protocol's wasm-call form
(driver.WasmDriver) over js/driver.js, which owns kernels.wasm's WebAssembly.Memory, so weights
can go from a Blob's slices into it in JS (write_from_slices) as they go to GPU buffers on
WebGPU, and a replay is one JS call of the module's `run`.

    driver = await create_wasm_driver()      # the kernels.wasm this package carries
    driver = await create_wasm_driver(threads=2)

Threads (docs/wasm.md "Threads"): in a cross-origin isolated page the driver runs on
min(navigator.hardwareConcurrency, MAX_AUTO_THREADS) threads (the page's ?threads=N, or `threads`,
overrides), kernels_mt.wasm over a shared memory, a recorded program cut into one per thread by
threads.py; elsewhere on one thread, kernels.wasm as before. `driver.threads` says how many run,
`driver.threads_note` why fewer than asked (None when all did).
"""
import sys
from importlib import resources

from ...errors import DeviceError
from .driver import WasmDriver
from .threads import ThreadedPrograms

_FACTORY = None
MAX_AUTO_THREADS = 8  # the automatic count's cap (more rarely helps a memory-bound decode)
MAX_THREADS = 64  # what ?threads= may ask for


def _js():
    if sys.platform != "emscripten":
        raise DeviceError("the browser wasm driver runs only inside Pyodide; natively use WasmtimeDriver")
    import js
    import pyodide.ffi as ffi
    return js, ffi


def thread_count(requested, js=None):
    """How many threads to ask for: `requested` (an int, or the page's ?threads= text), else the
    worker URL's ?threads=, else min(navigator.hardwareConcurrency, MAX_AUTO_THREADS); 1 where the
    page is not cross-origin isolated (driver.js says so in threads_note). A bad value is a clear
    DeviceError."""
    if requested is None and js is not None:
        requested = js.URL.new(js.location.href).searchParams.get("threads")
        requested = requested if isinstance(requested, str) else None  # (absent: JS null)
    if requested in (None, ""):
        cores = int(getattr(js.navigator, "hardwareConcurrency", 1) or 1) if js is not None else 1
        return max(1, min(cores, MAX_AUTO_THREADS))
    text = str(requested).strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_THREADS:
        raise DeviceError(f"?threads={requested} is not a thread count (1 to {MAX_THREADS})")
    return int(text)


async def create_wasm_driver(threads=None):
    global _FACTORY
    js, ffi = _js()
    package = resources.files("tallow.backends.wasm")
    wasm = package.joinpath("kernels.wasm")
    if not wasm.is_file():
        raise DeviceError("the wasm device needs kernels.wasm, which this tallow wheel lacks: "
                          "build the wheel after `make wasm`")
    if _FACTORY is None:
        _FACTORY = js.Function(package.joinpath("driver.js").read_text())()
    want = thread_count(threads, js)
    threaded = package.joinpath("kernels_mt.wasm")
    threaded_bytes = ffi.to_js(threaded.read_bytes()) if want > 1 and threaded.is_file() else None
    driver = BrowserWasmDriver(await _FACTORY(ffi.to_js(wasm.read_bytes()), threaded_bytes, want))
    driver.threads_asked = want
    return driver


class BrowserWasmDriver(ThreadedPrograms, WasmDriver):
    name = "browser"

    def __init__(self, js_kernels):
        _, self._ffi = _js()
        self._js = js_kernels
        self.table = int(js_kernels.table)
        self.threads = int(js_kernels.threads)
        note = js_kernels.threadsNote
        self.threads_note = note if isinstance(note, str) else None  # (JS null: all the threads asked for run)
        self.barrier_at = int(js_kernels.barrier)
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

    def _run_threads(self, table_at):
        try:
            self._js.runThreads(table_at, self.step.at)
        except self._ffi.JsException as e:
            raise DeviceError(f"the wasm device's threads failed: {e}") from None

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
