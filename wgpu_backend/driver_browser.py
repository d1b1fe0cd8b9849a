"""The browser driver: the driver protocol's WGSL launch form (tallow/backends/driver_protocol.py)
over `navigator.gpu`, for tallow running in Pyodide (a Web Worker or a page).

    driver = await create_browser_driver()     # or BrowserDriver.open() with run_sync available
    dev = tallow_wgpu.browser.register_device(driver)  # tallow.Device("wgpu") runs on the browser's GPU

Every kernel and all dispatch logic stay in the backend (backend.py and its op-family
modules); this module only moves bytes and records dispatches. Recording from Python through `js` proxies is
slow (50-85 us per dispatch), so dispatch() only appends integers to a Python
list and flush() hands the list to js/driver.js, which builds bind groups,
encodes and submits in one call.

Readback: WebGPU can only read a buffer through a Promise (mapAsync). With
JSPI (on by default in Chromium), `pyodide.ffi.run_sync` waits for it, but only
when Python was entered through runPythonAsync, PyProxy.callPromising or an
asyncio task; otherwise download raises a DeviceError saying so. A sync
readback costs about 1-2 ms in headless Chromium.
"""
import sys
from array import array
from importlib import resources

from tallow.backends.driver_protocol import nbytes_of
from tallow.errors import DeviceError

from .driver_native import ARENA_SLOTS, PARAMS_BYTES

_FACTORY = None


def _js():
    if sys.platform != "emscripten":
        raise DeviceError("the browser WebGPU driver runs only inside Pyodide; natively use the wgpu package")
    import js
    import pyodide.ffi as ffi
    return js, ffi


def _factory(js):
    global _FACTORY
    if _FACTORY is None:
        text = resources.files("tallow_wgpu").joinpath("js", "driver.js").read_text()
        _FACTORY = js.Function(text)()
    return _FACTORY


def _to_js(ffi, js, value):
    return ffi.to_js(value, dict_converter=js.Object.fromEntries)


_LIMITS = ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupsPerDimension",
           "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupStorageSize", "maxComputeWorkgroupSizeX",
           "maxStorageBuffersPerShaderStage")


async def request_device():
    """(adapter, device) from navigator.gpu, asking for the adapter's own limits and shader-f16 when it has it."""
    js, ffi = _js()
    gpu = getattr(js.navigator, "gpu", None)
    if gpu is None:
        raise DeviceError("wgpu device is not available: this browser has no WebGPU (navigator.gpu is missing); "
                          "Chrome/Edge 113+ or a browser with WebGPU enabled is needed")
    adapter = await gpu.requestAdapter()
    # No adapter resolves to JS null, which reaches Python as pyodide.ffi.jsnull (not None) in
    # Pyodide 0.28+: Chrome on Linux without a GPU driver has navigator.gpu yet no adapter.
    if adapter is None or adapter is getattr(ffi, "jsnull", None):
        raise DeviceError("wgpu device is not available: no WebGPU adapter (navigator.gpu.requestAdapter() found "
                          "none: WebGPU is disabled here, or the GPU or its driver is missing or blocklisted)")
    features = ["shader-f16"] if adapter.features.has("shader-f16") else []
    limits = {name: getattr(adapter.limits, name) for name in _LIMITS}
    device = await adapter.requestDevice(_to_js(ffi, js, {"requiredFeatures": features, "requiredLimits": limits}))
    return adapter, device


async def create_browser_driver():
    adapter, device = await request_device()
    return BrowserDriver(adapter, device)


class _Buffer:
    """A GPU buffer known to JS by id. Dropping it tells the driver, which forgets the id after its next submit."""
    __slots__ = ("id", "nbytes", "driver", "__weakref__")

    def __init__(self, driver, nbytes):
        self.driver, self.nbytes = driver, nbytes
        self.id = driver._js_driver.createBuffer(nbytes)

    def __del__(self):
        try:
            self.driver._dead.append(self.id)
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        return f"BrowserBuffer(id={self.id}, {self.nbytes} bytes)"


class _UniformBuffer(_Buffer):
    """A small uniform buffer known to JS by id (a captured step's step buffer)."""
    __slots__ = ()

    def __init__(self, driver, nbytes):
        self.driver, self.nbytes = driver, nbytes
        self.id = driver._js_driver.createUniform(nbytes)


class _Graph:
    """A captured step prepared in JS (js/driver.js record): replayed by id; dropping it frees it there."""
    __slots__ = ("id", "driver")

    def __init__(self, driver, graph_id):
        self.driver, self.id = driver, graph_id

    def __del__(self):
        try:
            self.driver._dead_graphs.append(self.id)
        except Exception:  # interpreter shutdown
            pass


class BrowserDriver:
    name = "browser"
    can_replay = True
    reads_js_buffers = True  # write_from_js: fetched weights go JS -> GPU, skipping the wasm heap

    @classmethod
    def open(cls):
        """Synchronous construction (needs run_sync: Python entered through runPythonAsync/callPromising)."""
        js, ffi = _js()
        if not ffi.can_run_sync():
            raise DeviceError("BrowserDriver.open() must wait for navigator.gpu, which needs Python entered through "
                              "runPythonAsync or callPromising (JSPI); use `await create_browser_driver()` instead")
        return ffi.run_sync(create_browser_driver())

    def __init__(self, adapter, device):
        js, ffi = _js()
        self._js, self._ffi = js, ffi
        self.adapter, self.device = adapter, device
        self.has_f16 = bool(device.features.has("shader-f16"))
        lim = device.limits
        self.limits = {
            "max_storage_binding": int(lim.maxStorageBufferBindingSize),
            "max_buffer": int(lim.maxBufferSize),
            "max_workgroups_per_dim": int(lim.maxComputeWorkgroupsPerDimension),
            "max_invocations": int(lim.maxComputeInvocationsPerWorkgroup),
            "max_workgroup_storage": int(lim.maxComputeWorkgroupStorageSize),
            "uniform_align": max(int(lim.minUniformBufferOffsetAlignment), 1),
            "storage_align": max(int(lim.minStorageBufferOffsetAlignment), 4),
        }
        info = getattr(adapter, "info", None)
        get = (lambda k: str(getattr(info, k, "") or "")) if info is not None else (lambda k: "")
        fallback = bool(getattr(info, "isFallbackAdapter", False) or getattr(adapter, "isFallbackAdapter", False))
        self.info = {
            "adapter": get("description") or get("device") or get("architecture") or "unknown",
            "vendor": get("vendor"),
            "architecture": get("architecture"),
            "backend_type": "WebGPU (browser)",
            "adapter_type": "CPU" if fallback else "",
        }
        self.cpu_emulated = fallback or "swiftshader" in (self.info["adapter"] + self.info["vendor"]).lower()
        self._js_driver = _factory(js)(device, PARAMS_BYTES * ARENA_SLOTS)
        # Uncaught WebGPU errors arrive as events: make them visible in the console.
        device.addEventListener("uncapturederror", ffi.create_proxy(
            lambda ev: js.console.error(f"tallow wgpu (browser): {ev.error.message}")))
        self._pipelines = {}
        self._ops = array("I")
        self._params = bytearray()
        self._dead = []
        self._dead_graphs = []
        self.submits = 0
        self.replays = 0
        self.readbacks = 0
        # bytes written into GPU buffers from Python memory (the wasm heap) and straight from JS buffers
        self.bytes_from_python = 0
        self.bytes_from_js = 0

    # ---- buffers ------------------------------------------------------------
    def alloc(self, dtype, numel):
        return _Buffer(self, nbytes_of(dtype, numel))

    def write(self, buf, byte_offset, data):
        if self._ops:
            self.flush()  # recorded work may still read this (pooled) buffer: queue writes run first
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n == 0:
            return
        if n % 4:
            mv = memoryview(bytes(mv) + bytes(-n % 4))
        proxy = self._ffi.create_proxy(mv)
        try:
            self._js_driver.writeFromPython(buf.id, byte_offset, proxy, len(mv))
        finally:
            proxy.destroy()
        self.bytes_from_python += n

    def write_from_js(self, buf, offset, array_buffer, src_offset, nbytes):
        """Copy nbytes of a JS ArrayBuffer (e.g. a fetched weights file) into buf, bypassing the wasm heap.
        offset must be a multiple of 4; nbytes and src_offset need not be. array_buffer may also be a
        sliced file (tallow.io.JsSlicedSource's object: a Blob over 2 GB, read slice by slice): then
        JS writes it into the GPU buffer one slice at a time (queue.writeBuffer at offsets), and
        Python waits for that through run_sync."""
        if offset % 4:
            raise DeviceError(f"write_from_js: GPU buffer offset {offset} is not a multiple of 4")
        if nbytes > buf.nbytes - offset:
            raise DeviceError(f"write_from_js: {nbytes} bytes at offset {offset} "
                              f"overrun a {buf.nbytes}-byte buffer")
        if self._ops:
            self.flush()
        if hasattr(array_buffer, "byteLength"):
            self._js_driver.writeFromJs(buf.id, offset, array_buffer, src_offset, nbytes)
        else:
            if not self._ffi.can_run_sync():
                raise DeviceError("copying a sliced file to the GPU needs Python entered through callPromising (JSPI)")
            self._ffi.run_sync(self._js_driver.writeFromSlices(buf.id, offset, array_buffer, src_offset, nbytes))
        self.bytes_from_js += nbytes

    def download(self, buf, byte_offset, nbytes):
        self.flush()
        if not self._ffi.can_run_sync():
            raise DeviceError("reading a WebGPU buffer from Python needs JSPI stack switching: enter Python through "
                              "pyodide.runPythonAsync or PyProxy.callPromising (not runPython / a plain callback)")
        start = byte_offset - byte_offset % 4
        end = byte_offset + nbytes
        end += -end % 4
        data = self._ffi.run_sync(self._js_driver.read(buf.id, start, end - start)).to_bytes()
        self.readbacks += 1
        return data[byte_offset - start:byte_offset - start + nbytes]

    def copy(self, src, src_offset, dst, dst_offset, nbytes):
        self._ops.extend((1, src.id, src_offset, dst.id, dst_offset, nbytes))

    def alloc_uniform(self, nbytes):
        return _UniformBuffer(self, nbytes)

    # ---- capture and replay (tallow.capture) -------------------------------------------
    def record(self, launches):
        """A captured step's launches, prepared once in JS (bind groups, a uniform buffer of parameters)."""
        ops, params = array("I"), bytearray()
        for pipeline, buffers, p, workgroups in launches:
            if len(p) > PARAMS_BYTES:
                raise DeviceError(f"kernel '{pipeline[1]}': {len(p)} bytes of parameters (max {PARAMS_BYTES})")
            ops.extend((0, pipeline[0], len(params), len(buffers)))
            for buf, off, size in buffers:
                ops.extend((buf.id, off, max(4, size)))
            ops.extend(workgroups)
            params += p + bytes(PARAMS_BYTES - len(p))
        proxy = self._ffi.create_proxy(memoryview(params))
        try:
            graph_id = self._js_driver.record(self._ffi.to_js(ops), proxy, PARAMS_BYTES, len(params))
        finally:
            proxy.destroy()
        return _Graph(self, int(graph_id))

    def replay(self, handle):
        """Encode and submit a recorded step: one JS call (work recorded before it is submitted first)."""
        if self._ops:
            self.flush()
        self._js_driver.replay(handle.id)
        self.replays += 1

    # ---- pipelines and dispatch -----------------------------------------------
    def pipeline(self, wgsl, label):
        p = self._pipelines.get(wgsl)
        if p is None:
            try:
                if self._ffi.can_run_sync():  # compile errors come back as messages, not as a console error
                    pid = self._ffi.run_sync(self._js_driver.compileAsync(wgsl, label))
                else:
                    pid = self._js_driver.compileSync(wgsl, label)
            except Exception as e:
                raise DeviceError(f"WGSL kernel '{label}' failed to compile: {e}") from None
            p = (int(pid), label)
            self._pipelines[wgsl] = p
        return p

    def dispatch(self, pipeline, bindings, params, workgroups):
        """bindings: (buf, offset, nbytes) for bindings 1.. in order; params: bytes for binding 0."""
        if len(params) > PARAMS_BYTES:
            raise DeviceError(f"kernel '{pipeline[1]}': {len(params)} bytes of parameters (max {PARAMS_BYTES})")
        if len(self._params) >= PARAMS_BYTES * ARENA_SLOTS:
            self.flush()
        slot = len(self._params)
        self._params += params
        self._params += bytes(PARAMS_BYTES - len(params))
        ops = self._ops
        ops.extend((0, pipeline[0], slot, len(bindings)))
        for buf, off, size in bindings:
            ops.extend((buf.id, off, max(4, size)))
        ops.extend(workgroups)

    def flush(self):
        if self._ops:
            ops_js = self._ffi.to_js(self._ops)  # a Uint32Array copy: one conversion per submit
            params = self._ffi.create_proxy(memoryview(self._params))
            try:
                self._js_driver.submit(ops_js, params, PARAMS_BYTES, len(self._params))
            finally:
                params.destroy()
            self.submits += 1
            self._ops = array("I")
            self._params = bytearray()
        if self._dead:
            dead, self._dead = self._dead, []
            self._js_driver.forget(self._ffi.to_js(dead))
        if self._dead_graphs:
            dead, self._dead_graphs = self._dead_graphs, []
            self._js_driver.forgetGraphs(self._ffi.to_js(dead))
