"""The WebGPU backend: tallow's backend contract as WGSL kernels.

Storage is a pooled GPU buffer (WgpuStorage). What each dtype becomes on the
GPU is described in wgsl.py: f32/i32/u32 as they are; f16 as f16 with
shader-f16, else as f32 rounded to f16 after every op; bf16 as f32 rounded to
bf16; i8/u8/bool widened to 32 bits on upload (by a kernel) and narrowed again
on download; i64 as i32 (uploads outside the i32 range are refused, and i64
arithmetic that could leave it runs exactly on the host: _exact_i64); f64 is
refused. GGUF blocks stay on the GPU as raw bytes: Q8_0, Q4_0, Q4_1, Q4_K and
Q6_K are dequantised inside the matmul kernels; other block formats are
dequantised once on upload.

This module never imports `wgpu`: it talks to a driver (driver_native.py
natively; a navigator.gpu driver in the browser) through the driver protocol's
WGSL launch form (tallow/backends/driver_protocol.py).
"""
import sys
from array import array

from tallow.backends.gpu_backend import GpuBackend
from tallow.backends.gpu_plan import IN_KERNEL_QUANTS
from tallow.backends.step_buffer import STEP_BYTES
from tallow.dtypes import i64, u8
from tallow.errors import ShapeError, UnsupportedError

from . import split, tuning, wgsl
from .attention import AttentionOps
from .common import WgpuStorage, _layout_words, _pack
from .elementwise import ElementwiseOps
from .indexing import IndexOps
from .matmul import MatmulOps
from .memory import MemoryOps
from .recording import STEP_CAPTURED, STEP_EAGER, entry_signature

# The op families live one module each (memory, elementwise, indexing, matmul, attention), as
# mixins over this class's plumbing; WgpuBackend is the one public class.
__all__ = ["WgpuBackend", "WgpuStorage", "probe"]

def probe():
    """Features of the wgpu device here, or DeviceError saying why there is none."""
    return WgpuBackend().features()


class WgpuBackend(MemoryOps, ElementwiseOps, IndexOps, MatmulOps, AttentionOps, GpuBackend):
    name = "wgpu"
    source_language = "wgsl"

    def __init__(self, driver=None, max_binding=None):
        """max_binding: assume storage bindings of at most this many bytes (default: the adapter's
        limit, or $TALLOW_WGPU_MAX_BINDING_MB); bigger weights are bound in pieces (split.py)."""
        if driver is None:
            if sys.platform == "emscripten":  # Pyodide: the browser's navigator.gpu
                from .driver_browser import BrowserDriver
                driver = BrowserDriver.open()
            else:
                from .driver_native import NativeDriver
                driver = NativeDriver()
        super().__init__(driver)
        self.has_f16 = driver.has_f16
        self.limits = dict(driver.limits)
        align = self.limits.setdefault("storage_align", 256)
        self.limits["max_storage_binding"] = split.binding_limit(self.limits["max_storage_binding"], align,
                                                                 max_binding)
        self._pipelines = {}
        self.tuning = tuning.Tuner(self)  # which matmul kernels serve more than one row here

    def features(self):
        return {
            "backend": "wgpu", "driver": self.driver.name, **self.driver.info,
            "cpu_emulated": self.driver.cpu_emulated,
            "f16": "native (shader-f16)" if self.has_f16 else "stored and computed as f32, rounded to f16",
            "bf16": "stored and computed as f32, rounded to bf16",
            "i64": "stored as i32 (values must fit in i32)",
            "i8/u8/bool": "widened to 32 bits on the GPU",
            "quantized_in_kernel": list(IN_KERNEL_QUANTS),
            "max_storage_binding": self.limits["max_storage_binding"],
            **self.plan_features(),
        }

    # ---- plumbing ---------------------------------------------------------------
    def _esize(self, dtype):
        return wgsl.elem_size(dtype, self.has_f16)

    def _alloc(self, nbytes):
        if nbytes > self.limits.get("max_buffer", nbytes):
            raise UnsupportedError(f"wgpu: a {nbytes}-byte tensor exceeds this adapter's maxBufferSize "
                                   f"({self.limits['max_buffer']} bytes)")
        buf, cap = self.pool.acquire(nbytes)
        return self._pooled(WgpuStorage(buf, cap, nbytes), buf, cap, u8)

    def _new(self, numel, dtype):
        return self._alloc(numel * self._esize(dtype))

    def _bind(self, st, what):
        size = (st.nbytes + 3) // 4 * 4
        limit = self.limits["max_storage_binding"]
        if size > limit:
            raise UnsupportedError(f"wgpu {what}: a {size}-byte tensor exceeds the storage binding limit "
                                   f"({limit} bytes: maxStorageBufferBindingSize or ${split.ENV}); only "
                                   "matmul weights and quantised embeddings are split into pieces")
        return (st.buf, 0, size)

    def _bind_range(self, st, offset, nbytes):
        """A binding of nbytes of st from byte offset (a multiple of the offset alignment)."""
        return (st.buf, offset, min((nbytes + 3) // 4 * 4, st.cap - offset))

    def _grid(self, groups, what):
        limit = self.limits["max_workgroups_per_dim"]
        if groups <= limit:
            return (max(groups, 1), 1, 1)
        rows = (groups + limit - 1) // limit
        if rows > limit:
            raise UnsupportedError(f"wgpu {what}: {groups} workgroups exceed maxComputeWorkgroupsPerDimension^2")
        return (limit, rows, 1)

    def _run(self, kernel, types, storages, words, groups, subs=None, extra=(), label=None, prelude=""):
        key = (kernel, tuple((k, v.name) for k, v in types.items()), tuple(sorted((subs or {}).items())), extra,
               prelude)
        pipe = self._pipelines.get(key)
        if pipe is None:
            src = wgsl.build(kernel, types, self.has_f16, subs, extra, prelude)
            pipe = self.driver.pipeline(src, label or kernel)
            self._pipelines[key] = pipe
        what = label or kernel
        binds = [s if isinstance(s, tuple) else self._bind(s, what) for s in storages]
        grid = groups if isinstance(groups, tuple) else self._grid(groups, what)
        self._launch(pipe, binds, _pack(words), grid, storages)

    def _launch(self, pipe, binds, params, grid, storages):
        """One dispatch (GpuBackend._submit records it while a step is captured); the entry holds
        bare buffers, so it keeps the storages it binds alive."""
        self._submit((pipe, binds, params, grid), [s for s in storages if isinstance(s, WgpuStorage)])

    def _issue(self, entry):
        self.driver.dispatch(*entry)

    # ---- capture and replay (tallow.capture): StepCapture, with these two pieces -----
    entry_signature = staticmethod(entry_signature)

    def _new_step_buffer(self, words):
        step = self.driver.alloc_uniform(STEP_BYTES)
        self.driver.write(step, 0, words)
        return step

    def overwrite(self, storage, data, dtype):
        if dtype.is_quantized or self._esize(dtype) != dtype.itemsize and dtype is not i64:
            raise UnsupportedError(f"wgpu overwrite: {dtype.name} is not stored as it is on the GPU")
        if dtype is i64:
            vals = array("q")
            vals.frombytes(data)
            self._check_i32(vals, "overwrite")
            data = array("i", vals).tobytes()
        if len(data) > storage.nbytes:
            raise ShapeError(f"wgpu overwrite: {len(data)} bytes do not fit a {storage.nbytes}-byte storage")
        self.driver.write(storage.buf, 0, data)

    def _step_variant(self, storages, from_step):
        """(prelude, bindings) of a position-dependent kernel: from_step (only while capturing) reads
        the step buffer at the binding after `storages`; else the neutral accessors."""
        if not from_step:
            return STEP_EAGER, storages
        cap = self._capture()
        return STEP_CAPTURED.format(binding=len(storages) + 1), storages + [(cap.step, 0, STEP_BYTES)]

    def _params(self, words, extras):
        """Element-wise layout words padded to 37, then kernel scalars from word 37."""
        words = list(words) + [0] * (37 - len(words))
        return words + list(extras)

    def _ew(self, kernel, op_label, types, ins, out, shape, extras=(), subs=None, prelude="", coalesce=True):
        """Dispatch an element-wise kernel: ins are (storage, offset, strides); one thread per element."""
        words = _layout_words(shape, [(o, s) for _, o, s in ins], coalesce, op_label)
        n = words[0]
        if n == 0:
            return
        self._run(kernel, types, [s for s, _, _ in ins] + ([out] if out is not None else []),
                  self._params(words, extras),
                  (n + 255) // 256, subs, label=op_label, prelude=prelude)

    def _contiguous(self, st, layout, dtype):
        """(storage, offset) holding the layout's elements contiguously (copying if needed)."""
        if layout.is_contiguous():
            return st, layout.offset
        return self.copy(st, layout, dtype), 0



    # ---- user-defined ops (tallow.custom_op: GpuBackend.custom checks, this launches) -----
    def custom_source(self, op):
        return op.wgsl

    def _custom_launch(self, op, source, args, out, numel):
        """Binding 0 is the uniform {numel}, then the inputs, then the output; @workgroup_size(64)."""
        pipe = self.driver.pipeline(source, f"custom op {op.name}")
        self._launch(pipe, [self._bind(st, op.name) for st in args + [out]], _pack([numel]),
                     self._grid((numel + 63) // 64, op.name), args + [out])
