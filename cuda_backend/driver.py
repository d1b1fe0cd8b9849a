"""The CuPy driver: device memory as cupy arrays, kernels compiled by NVRTC (cupy.RawModule;
cupy caches the binaries on disk) from the kernels tallow writes once for CUDA and Metal
(tallow/backends/gpu_kernels/, in CUDA C's spelling), launched with numpy scalars."""
import collections
import os

from tallow.backends import gpu_kernels
from tallow.errors import DeviceError

from tallow.backends.kernel.backend import DeviceStorage
from tallow.backends.kernel.host import F64, I32, I64, U32, U64, Meta

KERNEL_DIR = os.path.join(os.path.dirname(__file__), "kernels")  # CUDA-only kernels: kernels/<module>.cu
OWN_MODULES = ()  # the modules in KERNEL_DIR (none yet: every CUDA kernel is shared with Metal)
META_CACHE_SIZE = 4096
# The C type of each scalar kernel argument, as a numpy type name (int, long long, unsigned long long, double).
SCALAR_TYPES = {I32: "int32", I64: "int64", U32: "uint32", U64: "uint64", F64: "float64"}


def kernel_file(module):
    """The file a module's kernels are written in: CUDA's own, or the shared one."""
    return os.path.join(KERNEL_DIR, module + ".cu") if module in OWN_MODULES else gpu_kernels.module_path(module)


def kernel_source(module):
    """The module's whole source in CUDA C (cuda.h and common.h inlined: NVRTC needs no include path)."""
    return gpu_kernels.source("cuda", kernel_file(module))


def storage_numpy_dtype(dtype):
    """numpy dtype name a cupy array of this tallow dtype uses (bf16 as its uint16 bits, blocks as bytes)."""
    return "uint8" if dtype.is_quantized else dtype.np_name


class CupyDriver:
    name = "cuda"
    has_f64 = True
    atomic64 = True

    def __init__(self):
        try:
            import cupy
            import numpy
        except ImportError as e:
            raise DeviceError(f"CUDA needs cupy and numpy ({e}): pip install 'tallow[cuda]' "
                              "(cupy-cuda12x: CUDA 12 GPUs, Jetson with JetPack 6 included)") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # cupy raises CUDARuntimeError without a driver or a GPU
            raise DeviceError(f"no CUDA device: {e}") from None
        if count == 0:
            raise DeviceError("no CUDA device: the driver reports 0 GPUs")
        self.cp, self.np = cupy, numpy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.compute_capability = (props["major"], props["minor"])
        self._modules = {}
        self._functions = {}
        self._metas = collections.OrderedDict()
        # CUDA graphs (tallow.capture) are captured on and launched on this stream. Not the legacy
        # default stream (capture is refused there); blocking, so that the default stream's eager
        # launches and copies stay ordered with the graphs' work.
        self.can_replay = hasattr(cupy.cuda.Stream, "begin_capture")  # CuPy >= 10
        self.graph_error = None  # why a CUDA graph capture failed, once one has (replays then relaunch)
        self._graph_stream = cupy.cuda.Stream(non_blocking=False)

    # ---- memory -----------------------------------------------------------------
    def alloc(self, dtype, numel):
        return DeviceStorage(self.cp.empty(numel, dtype=storage_numpy_dtype(dtype)), dtype, numel)

    def upload(self, data, dtype):
        host = self.np.frombuffer(data, dtype=self.np.dtype(storage_numpy_dtype(dtype)).newbyteorder("<"))
        return DeviceStorage(self.cp.asarray(host.astype(host.dtype.newbyteorder("="), copy=False)), dtype, host.size)

    def download(self, st, byte_offset, nbytes):
        flat = st.buf.view(self.cp.uint8)
        return flat[byte_offset:byte_offset + nbytes].get().tobytes()

    def write(self, st, byte_offset, data):
        """Bytes over part of a buffer in place (a captured step's step buffer and inputs), on the
        stream the graphs run on: a blocking stream, so ordered with the default stream's work."""
        host = self.np.frombuffer(bytes(data), self.np.uint8)
        st.buf.view(self.cp.uint8)[byte_offset:byte_offset + host.size].set(host, stream=self._graph_stream)

    # ---- kernels ----------------------------------------------------------------
    def load_source(self, name, source):
        """The module key of a user's CUDA C source (a tallow.CustomOp), compiled by NVRTC on first launch."""
        import hashlib  # here, not at import: probing for the device loads this module (OpenSSL: +4 MB RSS)
        key = f"custom op {name} #{hashlib.sha256(source.encode()).hexdigest()[:12]}"
        if key not in self._modules:
            self._modules[key] = self.cp.RawModule(code=source, options=("--std=c++17",))
        return key

    def function(self, module, kernel):
        key = (module, kernel)
        fn = self._functions.get(key)
        if fn is None:
            mod = self._modules.get(module)
            if mod is None:
                mod = self._modules[module] = self.cp.RawModule(code=kernel_source(module), options=("--std=c++17",))
            try:
                fn = mod.get_function(kernel)
            except self.cp.cuda.compiler.CompileException as e:
                raise DeviceError(f"CUDA could not compile {module}: {e}") from None
            self._functions[key] = fn
        return fn

    def _meta(self, words):
        arr = self._metas.get(words)
        if arr is None:
            arr = self.cp.asarray(self.np.array(words, dtype=self.np.int32))
            self._metas[words] = arr
            if len(self._metas) > META_CACHE_SIZE:
                self._metas.popitem(last=False)
        else:
            self._metas.move_to_end(words)
        return arr

    def convert_arg(self, a):
        if isinstance(a, DeviceStorage):
            return a.buf
        if isinstance(a, Meta):
            return self._meta(a)
        kind = SCALAR_TYPES.get(type(a))
        if kind is None:
            raise TypeError(f"kernel argument of unknown kind: {a!r}")
        return getattr(self.np, kind)(a)

    def launch(self, module, kernel, grid, block, args):
        self.function(module, kernel)(tuple(grid), tuple(block), tuple(self.convert_arg(a) for a in args))

    # ---- capture and replay (tallow.capture; tallow.backends.step_recording) ------------------
    # UNTESTED ON HARDWARE: written against CuPy's documented Stream.begin_capture / end_capture
    # (-> cupy.cuda.Graph) and Graph.launch(stream); the CPU emulator covers the recording itself.
    def record(self, entries):
        """A recorded step's replay handle: the launches with their arguments converted once (the
        meta arrays stay referenced, so the meta cache never frees one the graph reads) and, when
        every entry is a kernel launch, the CUDA graph captured from them. A step with host calls
        (cuBLAS matmuls of float weights) is replayed launch by launch instead: cuBLAS may allocate
        its workspace during capture, which the graph would then read after it is freed."""
        prepared = []
        for e in entries:
            if e[0] == "launch":
                _, module, kernel, grid, block, args = e
                prepared.append((self.function(module, kernel), grid, block, tuple(self.convert_arg(a) for a in args)))
            else:
                prepared.append((None, e[1]))
        if any(p[0] is None for p in prepared) or self.graph_error:
            return None, prepared
        stream = self._graph_stream
        try:
            with stream:  # kernels launch on the current stream
                stream.begin_capture()
                try:
                    for fn, grid, block, args in prepared:
                        fn(grid, block, args)
                finally:
                    graph = stream.end_capture()
        except Exception as e:  # CUDA refused the capture: replay launch by launch (features() says why)
            self.graph_error = f"{type(e).__name__}: {e}"
            return None, prepared
        return graph, prepared

    def replay(self, handle):
        graph, prepared = handle
        if graph is not None:
            graph.launch(stream=self._graph_stream)
            return
        for p in prepared:
            if p[0] is None:
                p[1]()
            else:
                fn, grid, block, args = p
                fn(grid, block, args)
