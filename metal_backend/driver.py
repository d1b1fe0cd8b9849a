"""The PyObjC Metal driver: buffers in shared storage (Apple silicon's unified memory:
the CPU reads results in place, no blit), MSL compiled at run time per kernel module
(msl.h + common.h + the module, see kernel_source) with fast math off (NaN/inf must behave as in numpy),
and dispatches recorded into one command buffer that is committed at sync points
(a download), not after every op."""
import os
import struct
import sys

from tallow.backends import gpu_kernels
from tallow.errors import DeviceError, UnsupportedError
from tallow.backends.kernel.backend import DeviceStorage
from tallow.backends.kernel.host import F64, I32, I64, U32, U64, Meta

KERNEL_DIR = os.path.join(os.path.dirname(__file__), "kernels")  # Metal-only kernels: kernels/<module>.metal
OWN_MODULES = ("matmul",)  # the modules in KERNEL_DIR (CUDA's dense matmul is cuBLAS)


def kernel_file(module):
    """The file a module's kernels are written in: Metal's own, or the one shared with CUDA."""
    return os.path.join(KERNEL_DIR, module + ".metal") if module in OWN_MODULES else gpu_kernels.module_path(module)


def kernel_source(module):
    """The module's whole source in MSL (msl.h and common.h inlined before it)."""
    return gpu_kernels.source("msl", kernel_file(module))


def pack_arg(a):
    """Bytes for setBytes: Metal kernels take scalars as `constant T&` (float for F64: no double)."""
    if isinstance(a, Meta):
        return struct.pack(f"<{len(a)}i", *a)
    if isinstance(a, I32):
        return struct.pack("<i", a)
    if isinstance(a, I64):
        return struct.pack("<q", a)
    if isinstance(a, U32):
        return struct.pack("<I", a)
    if isinstance(a, U64):
        return struct.pack("<Q", a)
    if isinstance(a, F64):
        return struct.pack("<f", a)
    raise TypeError(f"kernel argument of unknown kind: {a!r}")


class MetalDriver:
    name = "metal"
    has_f64 = False  # Metal has no double
    atomic64 = False  # no 64-bit atomic add in MSL

    def __init__(self):
        if sys.platform != "darwin":
            raise DeviceError(f"Metal needs macOS (this is {sys.platform})")
        try:
            import Metal
        except ImportError as e:
            raise DeviceError(f"Metal needs PyObjC ({e}): pip install pyobjc-framework-Metal") from None
        device = Metal.MTLCreateSystemDefaultDevice()
        if device is None:
            raise DeviceError("no Metal device: MTLCreateSystemDefaultDevice returned nil")
        self.mtl, self.device = Metal, device
        self.queue = device.newCommandQueue()
        self.options = Metal.MTLResourceStorageModeShared
        self._libraries = {}
        self._pipelines = {}
        self._cmd = self._enc = None

    # ---- memory -----------------------------------------------------------------
    def alloc(self, dtype, numel):
        nbytes = numel if dtype.is_quantized else numel * dtype.itemsize
        buf = self.device.newBufferWithLength_options_(max(nbytes, 4), self.options)  # a 0-byte buffer is nil
        if buf is None:
            raise DeviceError(f"Metal could not allocate {nbytes} bytes")
        return DeviceStorage(buf, dtype, numel)

    def upload(self, data, dtype):
        data = bytes(data)
        if dtype.itemsize == 8 and dtype.is_float:
            raise UnsupportedError("the metal backend has no f64; convert to f32 first")
        numel = len(data) if dtype.is_quantized else len(data) // dtype.itemsize
        buf = self.device.newBufferWithBytes_length_options_(data if data else b"\0\0\0\0", max(len(data), 4),
                                                             self.options)
        return DeviceStorage(buf, dtype, numel)

    def download(self, st, byte_offset, nbytes):
        self.sync()
        view = st.buf.contents().as_buffer(st.buf.length())
        return bytes(view[byte_offset:byte_offset + nbytes])

    def write(self, st, byte_offset, data):
        """Bytes over part of a shared buffer in place (a captured step's step buffer and inputs),
        after the recorded work that may still read it has finished."""
        data = bytes(data)
        self.sync()
        view = st.buf.contents().as_buffer(st.buf.length())
        view[byte_offset:byte_offset + len(data)] = data

    # ---- kernels ----------------------------------------------------------------
    def _compile(self, source, what):
        opts = self.mtl.MTLCompileOptions.new()
        opts.setFastMathEnabled_(False)
        lib, err = self.device.newLibraryWithSource_options_error_(source, opts, None)
        if lib is None:
            raise DeviceError(f"Metal could not compile {what}: {err}")
        return lib

    def load_source(self, name, source):
        """The module key of a user's MSL source (a tallow.CustomOp), compiled once."""
        import hashlib  # here, not at import: probing for the device loads this module (OpenSSL: +4 MB RSS)
        key = f"custom op {name} #{hashlib.sha256(source.encode()).hexdigest()[:12]}"
        if key not in self._libraries:
            self._libraries[key] = self._compile(source, key)
        return key

    def pipeline(self, module, kernel):
        key = (module, kernel)
        pso = self._pipelines.get(key)
        if pso is None:
            lib = self._libraries.get(module)
            if lib is None:
                lib = self._libraries[module] = self._compile(kernel_source(module), f"{module}.metal")
            fn = lib.newFunctionWithName_(kernel)
            if fn is None:
                raise UnsupportedError(f"the metal backend has no kernel {kernel} in {module}.metal")
            pso, err = self.device.newComputePipelineStateWithFunction_error_(fn, None)
            if pso is None:
                raise DeviceError(f"Metal could not build the pipeline for {kernel}: {err}")
            self._pipelines[key] = pso
        return pso

    def _prepare(self, module, kernel, grid, block, args):
        """(pipeline, [(index, buffer)], [(index, bytes)], grid, block): one dispatch, ready to encode."""
        pso = self.pipeline(module, kernel)
        if block[0] * block[1] * block[2] > pso.maxTotalThreadsPerThreadgroup():
            raise UnsupportedError(f"{kernel}: {block} threads per threadgroup exceed this GPU's "
                                   f"{pso.maxTotalThreadsPerThreadgroup()}")
        bufs = [(i, a.buf) for i, a in enumerate(args) if isinstance(a, DeviceStorage)]
        consts = [(i, pack_arg(a)) for i, a in enumerate(args) if not isinstance(a, DeviceStorage)]
        return pso, bufs, consts, self.mtl.MTLSizeMake(*grid), self.mtl.MTLSizeMake(*block)

    def _encoder(self):
        if self._enc is None:
            self._cmd = self.queue.commandBuffer()
            self._enc = self._cmd.computeCommandEncoder()  # serial dispatch: each sees the previous one's writes
        return self._enc

    def _encode(self, enc, pso, bufs, consts, grid, block):
        enc.setComputePipelineState_(pso)
        for i, buf in bufs:
            enc.setBuffer_offset_atIndex_(buf, 0, i)
        for i, data in consts:
            enc.setBytes_length_atIndex_(data, len(data), i)
        enc.dispatchThreadgroups_threadsPerThreadgroup_(grid, block)

    def launch(self, module, kernel, grid, block, args):
        self._encode(self._encoder(), *self._prepare(module, kernel, grid, block, args))

    # ---- capture and replay (tallow.capture; tallow.backends.step_recording) ------------------
    # UNTESTED ON HARDWARE: the same PyObjC calls as launch(), prepared once per recording.
    can_replay = True

    def record(self, entries):
        """The recorded launches with their pipelines and argument bytes prepared, so a replay only
        encodes them (the Metal backend's matmul is a kernel: a step has no host calls)."""
        prepared = []
        for e in entries:
            if e[0] != "launch":
                raise UnsupportedError("metal: a captured step may hold only kernel launches")
            prepared.append(self._prepare(*e[1:]))
        return prepared

    def replay(self, prepared):
        """Encode the recorded dispatches into the pending command buffer (committed at the next sync)."""
        enc = self._encoder()
        for p in prepared:
            self._encode(enc, *p)

    def sync(self):
        """Commit what was recorded and wait for it."""
        if self._enc is not None:
            self._enc.endEncoding()
            self._cmd.commit()
            self._cmd.waitUntilCompleted()
            self._cmd = self._enc = None
