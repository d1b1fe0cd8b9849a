"""The native driver: the only module that touches the `wgpu` package. It implements the
driver protocol's WGSL launch form (tallow/backends/driver_protocol.py), as the browser driver
(navigator.gpu through Pyodide's `js` module) and the null driver do.

Dispatches are recorded into one command encoder (one compute pass) and
submitted only at sync points: a readback, an upload into a buffer while work
is pending, or a full parameter arena -- never one submit per op.

Each dispatch's parameters (sizes, strides, offsets, scalars: at most
PARAMS_BYTES) go into a slice of one uniform "arena" buffer. The slices are
collected in Python and the arena is written once, just before the submit that
uses it; queue writes are ordered before that submit, so this is safe.
"""
import os

from tallow.backends.driver_protocol import nbytes_of
from tallow.errors import DeviceError

PARAMS_BYTES = 256  # one dispatch's uniform slice; also WebGPU's max offset alignment
ARENA_SLOTS = 1024  # dispatches per submit at most


def _load_wgpu():
    try:
        import wgpu
    except ImportError:
        raise DeviceError("wgpu device is not available: the wgpu package is not installed: pip install wgpu") from None
    return wgpu


def _request_adapter(wgpu):
    """wgpu's high-performance adapter. Probing its drivers, the Vulkan loader's window-system layer
    (libwayland) prints "error: XDG_RUNTIME_DIR is invalid or not set in the environment." twice
    when that variable is unset or not an absolute path (a server, a container, sudo), though no
    window is wanted: for the probe it names a new private empty folder, then is restored. Nothing
    else is silenced: a real driver error still reaches stderr."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and runtime.startswith("/"):
        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    import tempfile
    folder = tempfile.mkdtemp(prefix="tallow-xdg-")  # mode 0700: no one else's socket can be found there
    os.environ["XDG_RUNTIME_DIR"] = folder
    try:
        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    finally:
        if runtime is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = runtime
        try:
            os.rmdir(folder)
        except OSError:
            pass


class NativeDriver:
    name = "native"
    can_replay = True
    reads_js_buffers = False  # no JS here: weights arrive as bytes through write

    def __init__(self):
        wgpu = _load_wgpu()
        self._wgpu = wgpu
        try:
            adapter = _request_adapter(wgpu)
        except Exception as e:  # wgpu raises plain RuntimeErrors when Vulkan/Metal/DX12 is missing
            raise DeviceError(f"wgpu device is not available: no WebGPU adapter ({e}); on Linux without a GPU "
                              "install a Vulkan driver: apt-get install mesa-vulkan-drivers") from None
        if adapter is None:
            raise DeviceError("wgpu device is not available: no WebGPU adapter; on Linux without a GPU install "
                              "a Vulkan driver: apt-get install mesa-vulkan-drivers")
        features = set(adapter.features)
        self.has_f16 = "shader-f16" in features
        wanted = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                  "max-compute-workgroups-per-dimension", "max-compute-invocations-per-workgroup",
                  "max-compute-workgroup-storage-size", "max-compute-workgroup-size-x")
        alimits = adapter.limits
        required = {k: alimits[k] for k in wanted if k in alimits}
        self.device = adapter.request_device_sync(
            required_features=["shader-f16"] if self.has_f16 else [], required_limits=required)
        limits = self.device.limits
        self.limits = {
            "max_storage_binding": int(limits["max-storage-buffer-binding-size"]),
            "max_buffer": int(limits["max-buffer-size"]),
            "max_workgroups_per_dim": int(limits["max-compute-workgroups-per-dimension"]),
            "max_invocations": int(limits["max-compute-invocations-per-workgroup"]),
            "max_workgroup_storage": int(limits["max-compute-workgroup-storage-size"]),
            "uniform_align": max(int(limits.get("min-uniform-buffer-offset-alignment", 256)), 1),
            "storage_align": max(int(limits.get("min-storage-buffer-offset-alignment", 256)), 4),
        }
        info = adapter.info
        self.info = {
            "adapter": info.get("device") or info.get("description") or "unknown",
            "vendor": info.get("vendor", ""),
            "architecture": info.get("architecture", ""),
            "description": info.get("description", ""),  # the driver and its version (Mesa 22.3.6 ...)
            "backend_type": info.get("backend_type", ""),
            "adapter_type": info.get("adapter_type", ""),
        }
        self.cpu_emulated = str(info.get("adapter_type", "")).upper() == "CPU"
        u = wgpu.BufferUsage
        self._storage_usage = u.STORAGE | u.COPY_SRC | u.COPY_DST
        self._arena = self.device.create_buffer(size=PARAMS_BYTES * ARENA_SLOTS, usage=u.UNIFORM | u.COPY_DST)
        self._pipelines = {}
        self._encoder = None
        self._pass = None
        self._params = bytearray()
        self.submits = 0  # counted so tests can check that ops are batched

    # ---- buffers ------------------------------------------------------------
    def alloc(self, dtype, numel):
        return self.device.create_buffer(size=max(4, nbytes_of(dtype, numel)), usage=self._storage_usage)

    def write(self, buf, byte_offset, data):
        # A pooled buffer may still be read by recorded work: submit that first,
        # because queue writes run before any later submit.
        if self._encoder is not None:
            self.flush()
        self.device.queue.write_buffer(buf, byte_offset, data)

    def download(self, buf, byte_offset, nbytes):
        self.flush()
        start = byte_offset - byte_offset % 4
        end = byte_offset + nbytes
        end += -end % 4
        data = self.device.queue.read_buffer(buf, start, end - start)
        return bytes(data)[byte_offset - start:byte_offset - start + nbytes]

    def copy(self, src, src_offset, dst, dst_offset, nbytes):
        self._begin()
        self._pass.end()
        self._encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)
        self._pass = self._encoder.begin_compute_pass()

    def alloc_uniform(self, nbytes):
        u = self._wgpu.BufferUsage
        return self.device.create_buffer(size=max(16, nbytes), usage=u.UNIFORM | u.COPY_DST)

    # ---- capture and replay ---------------------------------------------------------
    def record(self, launches):
        """A captured step's launches [(pipeline, bindings, params, workgroups)] prepared for replay:
        their parameters in one uniform buffer of their own, written once, and one bind group each."""
        params = bytearray()
        for _, _, p, _ in launches:
            if len(p) > PARAMS_BYTES:
                raise DeviceError(f"{len(p)} bytes of parameters (max {PARAMS_BYTES})")
            params += p + bytes(PARAMS_BYTES - len(p))
        u = self._wgpu.BufferUsage
        arena = self.device.create_buffer(size=max(PARAMS_BYTES, len(params)), usage=u.UNIFORM | u.COPY_DST)
        if params:
            self.device.queue.write_buffer(arena, 0, bytes(params))
        steps = []
        for i, (pipeline, bindings, _, workgroups) in enumerate(launches):
            entries = [{"binding": 0, "resource": {"buffer": arena, "offset": i * PARAMS_BYTES, "size": PARAMS_BYTES}}]
            for j, (buf, off, size) in enumerate(bindings):
                entries.append({"binding": j + 1, "resource": {"buffer": buf, "offset": off, "size": max(4, size)}})
            group = self.device.create_bind_group(layout=pipeline[1], entries=entries)
            steps.append((pipeline[0], group, tuple(workgroups)))
        return arena, steps

    def replay(self, handle):
        """Encode a recorded step into the open command encoder (submitted at the next sync point)."""
        self._begin()
        cpass = self._pass
        for pipeline, group, workgroups in handle[1]:
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*workgroups)

    # ---- pipelines and dispatch -----------------------------------------------
    def pipeline(self, wgsl, label):
        p = self._pipelines.get(wgsl)
        if p is None:
            try:
                module = self.device.create_shader_module(code=wgsl, label=label)
                p = self.device.create_compute_pipeline(
                    layout="auto", compute={"module": module, "entry_point": "main"}, label=label)
            except Exception as e:
                raise DeviceError(f"WGSL kernel '{label}' failed to compile: {e}") from None
            p = (p, p.get_bind_group_layout(0), label)
            self._pipelines[wgsl] = p
        return p

    def dispatch(self, pipeline, bindings, params, workgroups):
        """bindings: (buf, offset, nbytes) for bindings 1.. in order; params: bytes for binding 0."""
        if len(params) > PARAMS_BYTES:
            raise DeviceError(f"kernel '{pipeline[2]}': {len(params)} bytes of parameters (max {PARAMS_BYTES})")
        if len(self._params) >= PARAMS_BYTES * ARENA_SLOTS:
            self.flush()
        self._begin()
        slot = len(self._params)
        self._params += params
        self._params += bytes(PARAMS_BYTES - len(params))
        entries = [{"binding": 0, "resource": {"buffer": self._arena, "offset": slot, "size": PARAMS_BYTES}}]
        for i, (buf, off, size) in enumerate(bindings):
            entries.append({"binding": i + 1, "resource": {"buffer": buf, "offset": off, "size": max(4, size)}})
        group = self.device.create_bind_group(layout=pipeline[1], entries=entries)
        self._pass.set_pipeline(pipeline[0])
        self._pass.set_bind_group(0, group)
        self._pass.dispatch_workgroups(*workgroups)

    def _begin(self):
        if self._encoder is None:
            self._encoder = self.device.create_command_encoder()
            self._pass = self._encoder.begin_compute_pass()

    def flush(self):
        if self._encoder is None:
            return
        self._pass.end()
        if self._params:
            self.device.queue.write_buffer(self._arena, 0, bytes(self._params))
        self.device.queue.submit([self._encoder.finish()])
        self.submits += 1
        self._encoder = self._pass = None
        self._params = bytearray()
