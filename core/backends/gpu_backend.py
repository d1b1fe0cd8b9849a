"""GpuBackend: the one GPU backend core, under both GPU planners -- WgpuBackend (WGSL) and
KernelBackend (CUDA C / MSL, tallow.backends.kernel) -- over the one driver protocol
(driver_protocol.py). What it owns is everything that does not depend on a kernel language:

  memory       the buffer pool (buffer_pool.py): storages come from it and go back to it when
               their tensor dies; `pool_bytes` = 0 where the driver pools itself (CuPy)
  launching    `_submit(entry)`: every launch goes through it, recorded while a step is being
               captured (StepCapture, step_recording.py) and then issued by the form's
               `_issue(entry)` (dispatch on wgpu, launch or a host call on the kernel drivers)
  capture      which KV caches a captured step wrote, the position their slot offsets are held
               relative to, whether an attention reads such a cache whole (its key count then
               comes from the step buffer): the same rules on every GPU
  shared plans a 1-D convolution as a 2-D one of height 1, the convolution's output size and
               group check, the residual-add + norm pair, a custom op's checks

What stays in a subclass is its kernel table: which kernel serves an op, how its arguments are
packed (bindings plus a parameter uniform in WGSL; ordered arguments in CUDA C / MSL), how a
storage is bound, and what each kernel set cannot do (f64, i64, in-kernel block formats).
"""
import weakref

from tallow.dtypes import f32
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout, numel_of

from .base import Backend
from .buffer_pool import MIB, BufferPool
from .gpu_plan import conv_output_size
from .step_recording import StepCapture

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


class GpuBackend(StepCapture, Backend):
    pool_bytes = 256 * MIB      # idle bytes the buffer pool may keep (0: the driver pools its own memory)
    source_language = "kernel"  # the CustomOp attribute custom_source reads, for messages

    def __init__(self, driver):
        self.driver = driver
        self.pool = BufferPool(driver, self.pool_bytes)
        # The StepRecording each thread is capturing (tallow.capture): another thread's ops on
        # this device meanwhile run eagerly and stay out of it.
        self._captures = {}

    # ---- memory -----------------------------------------------------------------------
    def _pooled(self, storage, buf, cap, dtype):
        """storage (made over the pooled buffer buf of cap bytes), whose buffer goes back to the
        pool when it dies. A finalizer, not a __del__: it holds buf strongly, so a storage dying
        inside a garbage cycle does not take its buffer's GPU handle with it."""
        weakref.finalize(storage, self.pool.release, buf, cap, dtype)
        return storage

    # ---- launching ----------------------------------------------------------------------
    def _submit(self, entry, keep=()):
        """Issue one launch (an entry of the driver's recorded form), also recorded while this
        thread captures a step; keep: storages the entry binds that it does not hold itself."""
        cap = self._capture()
        if cap is not None:
            cap.add(entry, keep)
        self._issue(entry)

    def _issue(self, entry):
        raise NotImplementedError

    def capturing(self):
        """Whether a step is being captured (no first-use measurement then)."""
        return bool(self._captures)

    # ---- capture: the position-dependent ops -----------------------------------------------
    def _cache_write_position(self, kc, vc):
        """The position a KV-cache write holds its slot offsets relative to: a captured step's own
        (its kernels add it back from the step buffer, so the launch serves every position), else
        0. While capturing, marks the caches as written by the step (see _reads_whole_cache)."""
        cap = self._capture()
        if cap is None:
            return 0
        cap.cache_bufs.update((id(kc), id(vc)))
        return cap.position

    def _reads_whole_cache(self, k, lk, v, lv, mask):
        """Whether an attention reads a KV cache this captured step wrote, from its first slot to
        the step's last key, unmasked: its key count then comes from the step buffer (position +
        tokens), so the recorded launch serves every position."""
        cap = self._capture()
        return (cap is not None and mask is None and id(k) in cap.cache_bufs and id(v) in cap.cache_bufs
                and lk.offset == lv.offset == 0 and lk.shape[-2] == cap.position + cap.tokens)

    @staticmethod
    def _slot_words(layout, position, dim):
        """(offset, strides) of a cache slot or rotary rows, the offset relative to `position`
        along dim (the kernels add the step's position back); int32, as every kernel reads them."""
        words = [layout.offset - position * layout.strides[dim], *layout.strides]
        if any(not INT32_MIN <= w <= INT32_MAX for w in words):
            raise UnsupportedError(f"a KV cache or rotary table beyond int32 element offsets ({words})")
        return words

    # ---- shared plans ---------------------------------------------------------------------
    def add_rms_norm(self, x, lx, r, lr, w, lw, dtype, eps):
        return self._add_norm(x, lx, r, lr, w, lw, None, None, dtype, eps, False)

    def add_layer_norm(self, x, lx, r, lr, w, lw, b, lb, dtype, eps):
        return self._add_norm(x, lx, r, lr, w, lw, b, lb, dtype, eps, True)

    def _add_norm(self, x, lx, r, lr, w, lw, b, lb, dtype, eps, center):
        """(x + r, norm(x + r) * w + b) in one launch: the subclass's kernel."""
        raise NotImplementedError

    def conv1d(self, x, lx, w, lw, dtype, stride, padding, dilation, groups):
        # A 1-D convolution is a 2-D one over a height of 1.
        lx2 = Layout(lx.shape[:2] + (1,) + lx.shape[2:], lx.strides[:2] + (0,) + lx.strides[2:], lx.offset)
        lw2 = Layout(lw.shape[:2] + (1,) + lw.shape[2:], lw.strides[:2] + (0,) + lw.strides[2:], lw.offset)
        return self.conv2d(x, lx2, w, lw2, dtype, (1, stride), (0, padding), (1, dilation), groups)

    def _conv_output(self, lx, lw, stride, padding, dilation, groups):
        """(oh, ow) of a 2-D convolution; ShapeError for channels that do not split into groups
        or an input smaller than the dilated kernel."""
        _, cin, h, wd = lx.shape
        cout, cin_g, kh, kw = lw.shape
        if cin != cin_g * groups or cout % groups:
            raise ShapeError(f"{self.name} conv: {cin} input / {cout} output channels do not split into {groups} "
                             f"groups with {cin_g} inputs per group")
        oh = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
        ow = conv_output_size(wd, kw, stride[1], padding[1], dilation[1])
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"{self.name} conv: input {lx.shape} is smaller than the dilated kernel {lw.shape}")
        return oh, ow

    # ---- user-defined ops (tallow.custom_op) -----------------------------------------------
    def custom_source(self, op):
        """The CustomOp's source for this backend's kernel language (op.wgsl, op.cuda, op.msl), or None."""
        return None

    def custom(self, op, inputs, out_shape, out_dtype):
        """Run a tallow.CustomOp's kernel `main_kernel` over the output: the contiguous f32 inputs,
        the f32 output and the element count (an unsigned 32-bit number), one thread per output
        element; the subclass's _custom_launch says how its language receives them."""
        source = self.custom_source(op)
        if not source:
            raise UnsupportedError(f"custom op {op.name!r} has no implementation for the {self.name} backend "
                                   f"(no {self.source_language} source)")
        if out_dtype is not f32 or any(dt is not f32 for _, _, dt in inputs):
            raise UnsupportedError(f"custom op {op.name!r}: {self.source_language} custom kernels "
                                   f"take and return f32 tensors")
        numel = numel_of(out_shape)
        if numel > 0xFFFFFFFF:
            raise UnsupportedError(f"custom op {op.name!r}: {numel} elements exceed the kernel's 32-bit numel")
        args = [self._packed(st, lay, dt) for st, lay, dt in inputs]
        out = self._new(numel, f32)
        if numel:
            self._custom_launch(op, source, args, out, numel)
        return out

    def _packed(self, st, layout, dtype):
        """Storage holding the layout's elements contiguously from its start (no copy when it already does)."""
        if layout.offset == 0 and layout.is_contiguous():
            return st
        return self.copy(st, layout, dtype)

    def _new(self, numel, dtype):
        """A new storage of numel elements of dtype."""
        raise NotImplementedError

    def _custom_launch(self, op, source, args, out, numel):
        raise NotImplementedError
