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
  planning     each op whose plan does not depend on the kernel language is planned here once:
               reductions, scans, softmax, the norms, rope, row lookups, the quantised product
               (matvec or many-row path), attention, convolution, the fused decode ops (residual
               add + norm, KV-cache writes, biased and gated matvecs; and OPTIONAL_FUSED, one
               launch only where the subclass lists it in `fused_kernels`), a custom op's checks.
               A plan ends in a call of the subclass's `_<op>_kernel`

What stays in a subclass is its kernel table: those `_*_kernel` launches, which operands its
kernels take (`_attention_fits`, `_matvec_fits`, `_reads_blocks`, the matvec row limits, the
gate activations, `_check` for dtypes it lacks), how a storage is made and bound, and the ops
whose kernels differ in kind between the languages: memory and transfers, element-wise ops (WGSL
builds an op's expression into the shader; CUDA C / MSL pick it by an op code), scatter_add,
the dense product.
"""
import weakref
from typing import Container, NamedTuple

from tallow.dtypes import f32, i64
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout, numel_of

from .base import Backend
from .buffer_pool import MIB, BufferPool
from .gpu_plan import conv_output_size, in_kernel_quant, runs_matvec
from .operand import QKV, Operand, QuantWeight
from .reduce_plan import plan_reduce
from .specs import ConvSpec, NormSpec
from .step_recording import StepCapture

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# Fused decode ops not every kernel table has: planned here, one launch where the subclass lists
# the op in `fused_kernels`, else the composed default of base.py (plan_features says which).
# Each with the kernel-table hooks its one launch needs (a subclass listing the op has them).
OPTIONAL_FUSED = {"qmatmul_bias": ("_qmatvec_kernel",), "add_norm_linear": ("_norm_linear_kernel",),
                  "cache_attention": ("_cache_attention_kernel",)}


class ConvGeometry(NamedTuple):
    """A 2-D convolution's sizes, as the im2col and direct-convolution kernels take them."""
    b: int
    cin: int
    h: int
    w: int
    cout: int
    cin_g: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride_h: int
    stride_w: int
    pad_h: int
    pad_w: int
    dilation_h: int
    dilation_w: int
    groups: int


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
        if self._captures:  # a dict lookup only while some thread captures
            cap = self._capture()
            if cap is not None:
                cap.add(entry, keep)
        self._issue(entry)

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
        if min(words) < INT32_MIN or max(words) > INT32_MAX:
            raise UnsupportedError(f"a KV cache or rotary table beyond int32 element offsets ({words})")
        return words

    # ---- shared plans: each op planned once, its kernel launched by the subclass's `_*_kernel` ----
    def _check(self, dtype, op):
        """Refuse a dtype this kernel set cannot compute (f64 on Metal); nothing by default."""

    def reduce(self, op, st, layout, dtype, dims):
        self._check(dtype, op)
        plan = plan_reduce(self.name, op, layout, dtype, dims)
        if plan.rows == 0:
            return self._new(0, plan.out_dtype)
        if plan.length == 0:  # a sum or product of nothing (plan_reduce refused the others)
            return self.full(plan.rows, 0 if op == "sum" else 1, plan.out_dtype)
        return self._reduce_kernel(op, st, layout, dtype, dims, plan)

    def cumsum(self, st, layout, dtype, dim):
        self._check(dtype, "cumsum")
        out_dtype = dtype if dtype.is_float else i64  # integer sums accumulate in i64, as numpy's
        if layout.numel() == 0:
            return self._new(0, out_dtype)
        return self._cumsum_kernel(st, layout, dtype, dim, out_dtype)

    def softmax(self, st, layout, dtype, log=False):
        out = self._row_output("softmax", layout, dtype)
        if layout.numel():
            self._softmax_kernel(st, layout, out, log, dtype)
        return out

    def layer_norm(self, x, w, b, dtype, eps):
        return self._norm(x, NormSpec(w, b, eps, True), dtype)

    def rms_norm(self, x, w, dtype, eps):
        return self._norm(x, NormSpec(w, None, eps, False), dtype)

    def _norm(self, x, norm, dtype):
        out = self._row_output("layer_norm" if norm.center else "rms_norm", x.layout, dtype)
        if x.layout.numel():
            self._norm_kernel(x, norm, out, dtype)
        return out

    def _row_output(self, op, layout, dtype):
        """The output of an op over rows (softmax, a norm), which float dtypes alone have."""
        self._check(dtype, op)
        if not dtype.is_float:
            self._missing(f"{op} on {dtype.name}")
        return self._new(layout.numel(), dtype)

    def rope(self, x, rotary, dtype):
        self._check(dtype, "rope")
        out = self._new(x.layout.numel(), dtype)
        if x.layout.numel():
            self._rope_kernel(x, rotary, out, dtype)
        return out

    def index_select(self, x, ids, dtype, dim):
        (st, layout), (ids, lids) = x, ids
        if dtype.is_quantized:  # rows of a block-format embedding table, dequantised to f32
            return self._quantized_rows(st, layout, dtype, ids, lids, dim)
        shape = list(layout.shape)
        shape[dim] = lids.numel()
        out = self._new(numel_of(shape), dtype)
        if numel_of(shape):
            self._index_select_kernel(st, layout, dtype, ids, lids, dim, shape, out)
        return out

    def gather(self, x, ids, dtype, dim):
        (st, layout), (ids, lids) = x, ids
        out = self._new(lids.numel(), dtype)
        if lids.numel():
            self._gather_kernel(st, layout, dtype, ids, lids, dim, out)
        return out

    def add_rms_norm(self, x, r, w, dtype, eps):
        return self._add_norm(x, r, NormSpec(w, None, eps, False), dtype)

    def add_layer_norm(self, x, r, w, b, dtype, eps):
        return self._add_norm(x, r, NormSpec(w, b, eps, True), dtype)

    def _add_norm(self, x, r, norm, dtype):
        """(x + r, norm(x + r) * w + b) in one launch (centred: a layer norm, else RMS)."""
        self._check(dtype, "add_norm")
        numel = x.layout.numel()
        total, out = self._new(numel, dtype), self._new(numel, dtype)
        if numel:
            self._add_norm_kernel(x, r, norm, total, out, dtype)
        return total, out

    def kv_write(self, k, v, slots, dtype):
        """k and v into their cache slots in one launch. Words: k's and v's shapes, then the
        (offset, strides) of k, v and both cache slots (_slot_words; the slots relative to a
        captured step's position, which the kernel adds back from the step buffer)."""
        self._check(dtype, "kv_write")
        (k, lk), (v, lv), ((kc, lkc), (vc, lvc)) = k, v, slots
        nk, nv = lk.numel(), lv.numel()
        if nk + nv == 0:
            return
        pos = self._cache_write_position(kc, vc)
        words = [*lk.shape, *lv.shape]
        for lay, at in ((lk, 0), (lv, 0), (lkc, pos), (lvc, pos)):
            words += self._slot_words(lay, at, 2)
        self._kv_write_kernel(k, v, kc, vc, words, nk, nv, dtype)

    def rope_kv_write(self, qkv, rotary, slots, dtype):
        """Rotate q and k, write k and v into their cache slots, in one launch over the rotated
        pairs of q, k and v (v's pairs are copied). Words: the (offset, strides) of q, k, v, both
        cache slots and the cos and sin rows, the last four relative to a captured step's position."""
        self._check(dtype, "rope_kv_write")
        (q, lq), (k, lk), (v, lv) = qkv
        b, hq, t, d = lq.shape
        hk = lk.shape[1]
        if lv.shape != lk.shape:  # the kernels pair v's elements with k's
            return super().rope_kv_write(qkv, rotary, slots, dtype)
        ((kc, lkc), (vc, lvc)), ((cos, lcos), (sin, lsin), interleaved) = slots, rotary
        out = self._new(lq.numel(), dtype)
        pairs = b * (hq + 2 * hk) * t * (d // 2)
        if pairs == 0:
            return out
        pos = self._cache_write_position(kc, vc)
        words = []
        for lay, at, dim in ((lq, 0, 2), (lk, 0, 2), (lv, 0, 2), (lkc, pos, 2), (lvc, pos, 2), (lcos, pos, 0),
                             (lsin, pos, 0)):
            words += self._slot_words(lay, at, dim)
        self._rope_kv_write_kernel(q, k, v, cos, sin, kc, vc, out, words, pairs, (b, hq, hk, t, d // 2),
                                   interleaved, dtype)
        return out

    def attention(self, q, k, v, mask, dtype, spec):
        """softmax(q k^T * scale + mask) v in one launch where the kernel takes these operands
        (_attention_fits), else the subclass's _attention_unfused. Over the whole KV cache a
        captured step wrote, the kernel's key count comes from the step buffer."""
        self._check(dtype, "attention")
        if not self._attention_fits(q.layout, k.layout, v.layout):
            return self._attention_unfused(q, k, v, mask, dtype, spec)
        b, h, tq, _ = q.layout.shape
        numel = b * h * tq * v.layout.shape[3]
        if numel == 0:
            return self._new(0, dtype)
        if k.layout.shape[2] == 0:  # no keys: a weighted sum of nothing
            return self.full(numel, 0.0, dtype)
        out = self._new(numel, dtype)
        over_cache = self._reads_whole_cache(*k, *v, None if mask is None else mask.storage)
        self._attention_kernel(QKV(q, k, v), mask, out, dtype, spec, over_cache)
        return out

    # The decode matvecs: the planner chooses one fused launch or the composed default (base.py);
    # the subclass says which rows, activations and operands its kernels take.
    matvec_max_rows = 1    # rows of x the float matvec kernels take (gpu_plan.runs_matvec)
    qmatvec_max_rows = 1   # rows of x the quantised matvec kernels take
    activations: Container[str] = ()  # the unary ops a gated kernel applies to its gate
    # The fused ops of OPTIONAL_FUSED this kernel table runs as one launch (the others compose,
    # base.py), and the widest row add_norm_linear's kernel normalises.
    fused_kernels: Container[str] = frozenset()
    norm_linear_max_k = 0

    def _matvec_fits(self, b, lb, k, dtype):
        """Whether the float matvec kernels read b (k, n), a Linear's transposed weight, as it lies."""
        return False

    def batch_rows(self, wdtype, dtype):
        """The quantised matvec kernels compute each of their rows of x alone (a workgroup's
        dot over k in one order, whatever the row count): qmatvec_max_rows; a float weight's
        few-row products may be another kernel (matvec_max_rows)."""
        if wdtype.is_quantized:
            return self.qmatvec_max_rows if in_kernel_quant(wdtype) else 1
        return self.matvec_max_rows

    def _reads_blocks(self, w, wdtype, rows, k):
        """Whether the quantised matvec kernels read `rows` rows of k of w's blocks in place."""
        return in_kernel_quant(wdtype)

    def qmatmul(self, x, w, dtype):
        """x (m, k) . w^T for w (n, k) in a block format: the quantised matvec where x has a few
        rows (a decode step, a short prompt; gpu_plan.runs_matvec) and the kernel reads w's blocks
        where they lie, else the subclass's many-row product."""
        self._check(dtype, "qmatmul")
        n, k = w.rows, w.cols
        m = x.layout.numel() // k if k else 0
        if m * n == 0:
            return self._new(m * n, dtype)
        if runs_matvec(m, self.qmatvec_max_rows, w.dtype) and self._reads_blocks(w.storage, w.dtype, n, k):
            return self._qmatvec_kernel(x, w, dtype)
        return self._qmatmul_kernel(x, w, dtype)

    def qmatmul_bias(self, x, w, bias, dtype):
        """qmatmul + bias (n,) in one launch of the quantised matvec, where qmatmul would run the
        matvec and the kernel table has its biased form ("qmatmul_bias" in fused_kernels); else
        composed (qmatmul, then an add)."""
        (w, wdtype, n, k) = qw = w
        m = x.layout.numel() // k if k else 0
        if not ("qmatmul_bias" in self.fused_kernels and m * n and runs_matvec(m, self.qmatvec_max_rows, wdtype)
                and self._reads_blocks(w, wdtype, n, k)):
            return super().qmatmul_bias(x, qw, bias, dtype)
        self._check(dtype, "qmatmul_bias")
        return self._qmatvec_kernel(x, qw, dtype, bias)

    def matmul_bias(self, a, b, bias, dtype):
        m, k = a.layout.shape
        n = b.layout.shape[1]
        if not (m * n * k and runs_matvec(m, self.matvec_max_rows) and self._matvec_fits(*b, k, dtype)):
            return super().matmul_bias(a, b, bias, dtype)
        return self._matvec_kernel(a, b, dtype, bias)

    def gated_matmul(self, a, b, dtype, act):
        m, k = a.layout.shape
        n = b.layout.shape[1] // 2
        if not (m * n * k and act in self.activations and runs_matvec(m, self.matvec_max_rows)
                and self._matvec_fits(*b, k, dtype)):
            return super().gated_matmul(a, b, dtype, act)
        return self._gated_matvec_kernel(a, b, dtype, act)

    def gated_qmatmul(self, x, w, dtype, act):
        (w, wdtype, rows, k) = qw = w
        n = rows // 2
        m = x.layout.numel() // k if k else 0
        if not (m * n and dtype.is_float and act in self.activations and runs_matvec(m, self.qmatvec_max_rows, wdtype)
                and self._reads_blocks(w, wdtype, 2 * n, k)):
            return super().gated_qmatmul(x, qw, dtype, act)
        self._check(dtype, "gated_qmatmul")
        return self._gated_qmatvec_kernel(x, qw, dtype, act)

    def add_norm_linear(self, x, r, norm, linear, dtype):
        """One row (a decode step) whose norm width the kernel takes (norm_linear_max_k): one launch
        of the matvec kernel that normalises its input row itself ("add_norm_linear" in
        fused_kernels). Otherwise composed: add + norm (one launch), then the (biased, gated) matvec."""
        lx, w, act, gated = x.layout, linear.weight, linear.act, linear.gated
        k = lx.shape[-1]
        m = lx.numel() // k if k else 0
        if isinstance(w, QuantWeight):
            rows = w.rows
            fits = self._reads_blocks(w.storage, w.dtype, rows, k)
        else:  # w (rows, k) read as b = w^T (k, rows)
            lw = w.layout
            rows = lw.shape[0]
            fits = self._matvec_fits(w.storage, Layout((k, rows), lw.strides[::-1], lw.offset), k, dtype)
        n = rows // 2 if gated else rows
        if not ("add_norm_linear" in self.fused_kernels and fits and m == 1 and n
                and 0 < k <= self.norm_linear_max_k and (act is None or act in self.activations)):
            return super().add_norm_linear(x, r, norm, linear, dtype)
        self._check(dtype, "add_norm_linear")
        return self._norm_linear_kernel(x, r, norm, linear, dtype, n)

    def cache_attention(self, qkv, cache, rotary, mask, dtype, spec):
        """A one-token step without a mask, over caches the kernel reads (_cache_attention_fits): one
        launch that rotates, appends and attends ("cache_attention" in fused_kernels). Otherwise
        composed: rope_kv_write (or kv_write), then attention, each one launch."""
        if not ("cache_attention" in self.fused_kernels and qkv.q.layout.shape[2] == 1 and mask is None
                and self._cache_attention_fits(cache.keys.layout, cache.values.layout)):
            return super().cache_attention(qkv, cache, rotary, mask, dtype, spec)
        self._check(dtype, "cache_attention")
        return self._cache_attention_kernel(qkv, cache, rotary, dtype, spec)

    def plan_features(self):
        """What `tallow devices` shows of the plan: the optional fused ops this kernel table runs as
        one launch, and those it composes from the other primitives."""
        return {"fused_ops": ",".join(op for op in OPTIONAL_FUSED if op in self.fused_kernels) or "none",
                "composed_ops": ",".join(op for op in OPTIONAL_FUSED if op not in self.fused_kernels) or "none"}

    def conv1d(self, x, w, dtype, spec):
        # A 1-D convolution is a 2-D one over a height of 1.
        (x, lx), (w, lw) = x, w
        lx2 = Layout(lx.shape[:2] + (1,) + lx.shape[2:], lx.strides[:2] + (0,) + lx.strides[2:], lx.offset)
        lw2 = Layout(lw.shape[:2] + (1,) + lw.shape[2:], lw.strides[:2] + (0,) + lw.strides[2:], lw.offset)
        return self.conv2d(Operand(x, lx2), Operand(w, lw2), dtype,
                           ConvSpec((1, spec.stride), (0, spec.padding), (1, spec.dilation), spec.groups))

    def conv2d(self, x, w, dtype, spec):
        """im2col on the device, then one batched matmul of the grouped weights by the columns;
        where the columns would not fit (_im2col_fits), a direct convolution kernel."""
        self._check(dtype, "conv")
        (x, lx), (w, lw) = x, w
        stride, padding, dilation, groups = spec.stride, spec.padding, spec.dilation, spec.groups
        b, cin, h, wd = lx.shape
        cout, cin_g, kh, kw = lw.shape
        oh, ow = self._conv_output(lx, lw, stride, padding, dilation, groups)
        g = ConvGeometry(b, cin, h, wd, cout, cin_g, kh, kw, oh, ow, *stride, *padding, *dilation, groups)
        numel = b * cout * oh * ow
        if numel == 0:
            return self._new(0, dtype)
        xs, ws = self._packed(x, lx, dtype), self._packed(w, lw, dtype)
        taps, cout_g = cin_g * kh * kw, cout // groups
        col_numel = b * cin * kh * kw * oh * ow
        if not self._im2col_fits(col_numel, dtype):
            out = self._new(numel, dtype)
            self._direct_conv_kernel(xs, ws, out, numel, g, dtype)
            return out
        cols = self._new(col_numel, dtype)
        self._im2col_kernel(xs, cols, col_numel, g, dtype)
        # (b, groups, cout_g, taps) @ (b, groups, taps, oh * ow): the weight is shared across the batch (stride 0).
        return self.matmul(Operand(ws, Layout((b, groups, cout_g, taps), (0, cout_g * taps, taps, 1))),
                           Operand(cols, Layout((b, groups, taps, oh * ow))), dtype)

    def _im2col_fits(self, col_numel, dtype):
        """Whether im2col's columns fit where the matmul can read them (wgpu: one binding)."""
        return True

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

    # ---- the kernel table: what a subclass provides for the plans above ---------------------
    # Each launches its kernel into the output the plan made, or, where its docstring says so,
    # makes and returns the result itself. The hooks of the norms, rope, attention and the matvecs
    # take the primitive's Operands and specs (operand.py, specs.py); the others take storages
    # with their layouts, or the launch words the plan packed (the KV-cache writes).
    def _new(self, numel, dtype):
        """A new storage of numel elements of dtype (from the pool)."""
        raise NotImplementedError

    def _issue(self, entry):
        """Hand one recorded-form entry to the driver."""
        raise NotImplementedError

    def _reduce_kernel(self, op, st, layout, dtype, dims, plan):
        """The reduction's result storage (plan: reduce_plan.ReducePlan, rows and length > 0)."""
        raise NotImplementedError

    def _cumsum_kernel(self, st, layout, dtype, dim, out_dtype):
        """The scan's result storage, in layout's dim order."""
        raise NotImplementedError

    def _softmax_kernel(self, st, layout, out, log, dtype):
        raise NotImplementedError

    def _norm_kernel(self, x, norm, out, dtype):
        """x's rows normalised into out (norm: a NormSpec)."""
        raise NotImplementedError

    def _rope_kernel(self, x, rotary, out, dtype):
        raise NotImplementedError

    def _attention_fits(self, lq, lk, lv):
        raise NotImplementedError

    def _attention_unfused(self, q, k, v, mask, dtype, spec):
        """Attention (the primitive's Operands and AttentionSpec) where the kernel does not fit:
        composed, or a refusal naming the limit."""
        raise NotImplementedError

    def _attention_kernel(self, qkv, mask, out, dtype, spec, over_cache):
        """attention of the QKV operands into out (spec an AttentionSpec); over_cache: the keys are a
        captured step's whole KV cache, their count read from the step buffer."""
        raise NotImplementedError

    def _index_select_kernel(self, st, layout, dtype, ids, lids, dim, shape, out):
        """ids: the index tensor's storage in whatever integer dtype it has (the contract passes none)."""
        raise NotImplementedError

    def _quantized_rows(self, st, layout, dtype, ids, lids, dim):
        """The f32 rows `ids` of a (rows, k) block-format table: the result storage."""
        raise NotImplementedError

    def _gather_kernel(self, st, layout, dtype, ids, lids, dim, out):
        raise NotImplementedError

    def _add_norm_kernel(self, x, r, norm, total, out, dtype):
        """x + r into total and its norm (a NormSpec) into out."""
        raise NotImplementedError

    def _kv_write_kernel(self, k, v, kc, vc, words, nk, nv, dtype):
        raise NotImplementedError

    def _rope_kv_write_kernel(self, q, k, v, cos, sin, kc, vc, out, words, pairs, dims, interleaved, dtype):
        """dims: (batch, q heads, kv heads, tokens, pairs per head)."""
        raise NotImplementedError

    def _qmatvec_kernel(self, x, w, dtype, bias=None):
        """x . w^T (w a QuantWeight; + bias (n,), only where "qmatmul_bias" is in fused_kernels) by the
        quantised matvec: the result storage."""
        raise NotImplementedError

    def _qmatmul_kernel(self, x, w, dtype):
        """x . w^T where the quantised matvec does not serve: the result storage."""
        raise NotImplementedError

    def _matvec_kernel(self, a, b, dtype, bias=None):
        """a (m, k) . b (k, n) + bias: the result storage."""
        raise NotImplementedError

    def _gated_matvec_kernel(self, a, b, dtype, act):
        """act(a . gate) * (a . up), b's columns the gate then the up rows: the result storage."""
        raise NotImplementedError

    def _gated_qmatvec_kernel(self, x, w, dtype, act):
        """act(x . gate^T) * (x . up^T) for w a QuantWeight of rows [gate; up]: the result storage."""
        raise NotImplementedError

    def _norm_linear_kernel(self, x, r, norm, linear, dtype, n):
        """add_norm_linear (the primitive's arguments) of one row in one launch, n output columns:
        (hidden or None, y)."""
        raise NotImplementedError

    def _cache_attention_fits(self, lkc, lvc):
        """Whether the one-launch cache attention reads these caches."""
        return False

    def _cache_attention_kernel(self, qkv, cache, rotary, dtype, spec):
        """cache_attention (the primitive's arguments; no mask) of one token in one launch (or two:
        a split-K combine): the result storage."""
        raise NotImplementedError

    def _im2col_kernel(self, xs, cols, col_numel, g, dtype):
        raise NotImplementedError

    def _direct_conv_kernel(self, xs, ws, out, numel, g, dtype):
        """Only where _im2col_fits says no."""
        raise NotImplementedError

    def _custom_launch(self, op, source, args, out, numel):
        raise NotImplementedError
