"""WasmBackend: the `wasm` device (issue 31). GpuBackend's planning (gpu_backend.py: capture rules,
op plans) over the wasm-call driver (driver.WasmDriver: WasmtimeDriver natively, BrowserWasmDriver
in the page), with a kernel table that launches kernels.wasm's exports. Storages are byte ranges
of the module's memory (WasmStorage); a launch is ("call", export, args) with buffers standing for
their addresses; a captured step is one program the module's `run` executes in one call.

What it computes, all in float32 (other dtypes are held, moved and copied, never computed on):
the GGUF block products (every format, any row count: quantize_row + matmul_<fmt>; the SwiGLU
product through silu_mul), the embedding rows of a block table (dequant_<fmt>), RMS and layer norms
with or without their residual add, rope, the fused rope + KV-cache write and attention over the
cache (cache_attention for one token, cache_attention_rows for a prompt; GQA), softmax, silu,
gelu, argmax, copies of contiguous data and of row-strided views (copy_f32 per row); and on
elementwise_ir's and gemm_ir's kernels: strided and broadcast unary/binary ops and reductions over
views of up to 4 merged dims, f32 copies of any view, f16 <-> f32 casts, the float product
(gemm_f32, batched; gemm_f16 where the right operand is an f16 weight, held as f16:
f16_weight_products), attention without a cache composed from it (scores, softmax_rows, values),
conv1d (im2col + GEMM), softmax over rows, row lookups in f32 tables (and f16 tables of whole
4-byte words, copied as they lie).
Anything else raises UnsupportedError naming the wasm device and the op: nothing is computed
elsewhere in silence. Memory ops (from/to bytes and lists, full, arange, overwrite) are host writes
and reads of the memory, as on every GPU backend.

Eager launches of many small calls (a norm row by row, a strided copy) go to the module as one
throwaway program (one `run` call); while a step is captured they are recorded one by one into the
step's program. The captured step's step words are the driver's own (position, token): a StepArg
over "position" moves the KV slots, the rotary rows and the key count; one over "token" moves the
embedding row, whose id replay() takes from the graph input overwrite() wrote (checked there).
"""
import itertools
import struct
import weakref

from tallow.dtypes import bf16, bool_, f16, f32, i64
from tallow.errors import IndexRangeError, ShapeError, UnsupportedError
from tallow.layout import Layout, kernel_meta

from ..gpu_backend import GpuBackend
from ..kernel.host import BINARY_CODES, REDUCE_CODES, UNARY_CODES
from ..operand import Operand
from ..python_storage import (bf16_from_bytes, bf16_to_bytes, f16_from_bytes, f16_to_bytes, from_le_bytes, pack,
                              to_le_bytes)
from .driver import WasmBuffer
from .program import GEMM_MB, OPCODES, StepArg

BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34, "q4_k": 144, "q5_k": 176, "q6_k": 210}
BATCH_CALLS = 3  # eager launches of more calls than this go to the module as one program
META_DIMS = 4  # the strided kernels' meta words (elementwise_ir.MAX_DIMS)
GEMM_NR = 8  # a GEMM's scratch is GEMM_NR * k floats (gemm_ir.scratch_floats)
# more rows of A than a GEMM's largest block (program.GEMM_MB; at k <= 640 its blocks are what 40 KB
# of packed A tiles hold, 24 rows at k = 384): gemm_f16 would widen every weight panel more than once
GEMM_ROW_BLOCK = GEMM_MB
# What elementwise_ir's strided kernels compute (its UNARY_OPS, BINARY_OPS, REDUCE_OPS: the GPU kernels'
# op codes, kernel/host.py); tests/test_wasm_device.py keeps these equal to the kernels' own tables.
WASM_UNARY = ("neg", "abs", "exp", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu",
              "square", "reciprocal", "floor", "ceil", "round", "sign", "clamp", "affine")
WASM_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
WASM_REDUCE = ("sum", "prod", "max", "min")


class WasmStorage:
    """One tensor in the module's memory: `buf` (a WasmBuffer), its dtype and element count (the
    byte count for block dtypes). The buffer goes back to the driver when the storage dies."""
    __slots__ = ("buf", "dtype", "numel", "__weakref__")

    def __init__(self, buf, dtype, numel):
        self.buf, self.dtype, self.numel = buf, dtype, numel

    @property
    def nbytes(self):
        return self.numel if self.dtype.is_quantized else self.numel * self.dtype.itemsize

    def at(self, elements=0):
        """The launch argument for this storage's element `elements` (a byte offset into its buffer)."""
        return (self.buf, elements * (1 if self.dtype.is_quantized else self.dtype.itemsize))

    def __repr__(self):
        return f"WasmStorage({self.dtype.name}, {self.numel})"


def _arg_signature(a):
    if isinstance(a, WasmBuffer):
        return ("buffer", a.nbytes)
    if isinstance(a, StepArg):
        return ("step", _arg_signature(a.base), a.stride, a.slot)
    if isinstance(a, tuple):
        return ("at", a[0].nbytes, a[1])
    return (type(a).__name__, a)


def entry_signature(entry):
    """What must match for two recorded calls to be the same at two positions: the export and
    every argument (buffer sizes, not which buffer; numbers; StepArgs' strides and slots)."""
    return (entry[1], tuple(_arg_signature(a) for a in entry[2]))


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def _row_offsets(layout):
    """(element offsets of the rows, row length) of a layout whose last dim (after coalescing)
    is contiguous; None when it is not (a transposed or broadcast last dim)."""
    lay = layout.coalesced()
    if not lay.shape:
        return [lay.offset], 1
    last, stride = lay.shape[-1], lay.strides[-1]
    if stride != 1 and last != 1:
        return None
    outer = [range(0, size * st, st) if st else [0] * size for size, st in zip(lay.shape[:-1], lay.strides[:-1])]
    return [lay.offset + sum(idx) for idx in itertools.product(*outer)], last


class WasmBackend(GpuBackend):
    name = "wasm"
    pool_bytes = 0  # the driver reuses ranges of its own memory by size (driver.WasmDriver)
    source_language = "wasm"
    # gated products: silu(gate) * up by silu_mul after one product over [gate; up]
    activations = frozenset({"silu"})
    qmatvec_max_rows = 1 << 30  # matmul_<fmt> takes any number of rows (4-row tiles, then single rows)
    f16_weight_products = True  # matmul by an f16 weight as it lies: gemm_f16 (the weights held once, as f16)

    def __init__(self, driver=None):
        if driver is None:
            from .driver_native import WasmtimeDriver
            driver = WasmtimeDriver()
        super().__init__(driver)
        self.replays = 0  # captured steps replayed (each one `run` call)
        # graph inputs a captured embedding row reads as the step's token -> rows of the table
        self._token_inputs = weakref.WeakKeyDictionary()
        self._token = 0

    def _missing(self, op):
        raise UnsupportedError(f"the wasm device has no kernel for {op} (docs/wasm.md: what comes next)")

    def features(self):
        return {"driver": self.driver.name, "kernels": "kernels.wasm (SIMD128)", **self.plan_features()}

    def plan_features(self):
        # cache_attention is this table's own plan (rope, the KV write and attention as one list of
        # calls), not GpuBackend's composition; the other two compose from the primitives
        return {"fused_ops": "cache_attention", "composed_ops": "qmatmul_bias,add_norm_linear"}

    def batch_rows(self, wdtype, dtype):
        return 1  # not shown: a 4-row tile's rows equal to single-row products bit for bit

    def _check(self, dtype, op):
        if dtype is not f32:
            raise UnsupportedError(f"the wasm device computes {op} in f32 only, not {dtype.name}")

    # ---- memory -----------------------------------------------------------------------
    def _new(self, numel, dtype):
        return WasmStorage(self.driver.alloc(dtype, numel), dtype, numel)

    def _scratch(self, nbytes):
        """Zeroed bytes for one op's own use (quantised activations, attention scores)."""
        return self.driver.alloc_bytes(nbytes)

    def _upload(self, data, dtype, numel):
        return WasmStorage(self.driver.upload(data, dtype), dtype, numel)

    def from_bytes(self, data, dtype):
        data = bytes(data)
        self._check_whole_elements(len(data), dtype)
        return self._upload(data, dtype, len(data) if dtype.is_quantized else len(data) // dtype.itemsize)

    def to_bytes(self, st, layout, dtype):
        if dtype.is_quantized:
            return self.driver.download(st.buf, 0, st.nbytes)
        n = layout.numel()
        if layout.is_contiguous():
            return self.driver.download(st.buf, layout.offset * dtype.itemsize, n * dtype.itemsize)
        return self.driver.download(self.copy(st, layout, dtype).buf, 0, n * dtype.itemsize)

    @staticmethod
    def _pack(values, dtype):
        if dtype.is_quantized:
            raise UnsupportedError(f"the wasm device makes {dtype.name} blocks from bytes only, not from numbers")
        arr = pack(values, dtype)
        if dtype is f16:
            return f16_to_bytes(arr)
        if dtype is bf16:
            return bf16_to_bytes(arr)
        return to_le_bytes(arr)

    def from_list(self, values, dtype):
        values = values if isinstance(values, list) else list(values)
        return self._upload(self._pack(values, dtype), dtype, len(values))

    def to_list(self, st, layout, dtype):
        raw = self.to_bytes(st, layout, dtype)
        if dtype is f16:
            return f16_from_bytes(raw).tolist()
        if dtype is bf16:
            return bf16_from_bytes(raw).tolist()
        if dtype is bool_:
            return [b != 0 for b in raw]
        return from_le_bytes(dtype.code, raw).tolist()

    def full(self, numel, value, dtype):
        cap = self._capture()
        if cap is not None:  # a host write is not a launch: a replay could not redo it
            cap.computed_on_host("a fill (host write)")
        return self._upload(self._pack([value], dtype) * numel, dtype, numel)

    def overwrite(self, storage, data, dtype):
        data = bytes(data)
        if len(data) > storage.nbytes:
            raise ShapeError(f"wasm overwrite: {len(data)} bytes do not fit a {storage.nbytes}-byte storage")
        rows = self._token_inputs.get(storage)
        if rows is not None:  # a graph input a captured embedding row reads
            (value,) = struct.unpack_from("<q" if dtype is i64 else "<i", data)
            if not 0 <= value < rows:
                raise IndexRangeError(f"embedding: token id {value} is outside the table (0 to {rows - 1})")
            self._token = value
        self.driver.write(storage.buf, 0, data)

    # ---- launching ----------------------------------------------------------------------
    def _issue(self, entry):
        self.driver.launch(entry[1], entry[2])

    def _call(self, kernel, *args):
        self._submit(("call", kernel, list(args)))

    def _calls(self, calls):
        """Several launches [(kernel, args)]: recorded one by one while capturing, else one program."""
        if self._capture() is not None or len(calls) <= BATCH_CALLS:
            for kernel, args in calls:
                self._submit(("call", kernel, list(args)))
            return
        self.driver.replay(self.driver.record([("call", kernel, list(args)) for kernel, args in calls]))

    # ---- capture and replay: StepCapture with the driver's step words ---------------------
    entry_signature = staticmethod(entry_signature)

    def _new_step_buffer(self, words):
        position = struct.unpack_from("<I", words)[0]
        self.driver.write(self.driver.step, 0, struct.pack("<2i", position, 0))
        return self.driver.step

    def _moving(self, base, stride, slot="position"):
        """base (an address argument or a count), plus stride times the step word while capturing."""
        return StepArg(base, stride, slot) if self._capture() is not None else base

    def replay(self, recording, position, tokens):
        if recording.host_computed:
            raise UnsupportedError(f"capture: the step computed {recording.host_computed[0]} from its own data, "
                                   "which a replay cannot redo; run it eagerly")
        self.driver.write(self.driver.step, 0, struct.pack("<2i", position, self._token))
        self.driver.replay(recording.handle)
        self.replays += 1

    # ---- element-wise -------------------------------------------------------------------
    def _row_copies(self, st, layout, dtype, out):
        """Copy calls of layout's elements into out (contiguous), row by row; None if it cannot."""
        size = dtype.itemsize
        rows = _row_offsets(layout)
        if rows is None or (rows[1] * size) % 4:
            return None
        offsets, n = rows
        return [("copy_f32", (st.at(o), n * size // 4, out.at(i * n))) for i, o in enumerate(offsets)]

    def copy(self, st, layout, dtype):
        n = layout.numel()
        if dtype.is_quantized:
            if st.nbytes % 4:
                self._missing(f"a copy of {st.nbytes} bytes of {dtype.name} blocks (whole words only)")
            out = self._new(st.nbytes, dtype)
            self._call("copy_f32", st.at(), st.nbytes // 4, out.at())
            return out
        out = self._new(n, dtype)
        if n == 0:
            return out
        calls = self._row_copies(st, layout, dtype, out)
        if calls is None and dtype is f32:  # a strided last dim: the strided kernel's clamp to +-inf
            self._call("unary_f32", UNARY_CODES["clamp"], st.at(), out.at(), self._meta(layout.shape, [layout]),
                       float("-inf"), float("inf"))
            return out
        if calls is None:
            self._missing(f"a strided copy of {dtype.name} {layout} (rows of whole words only)")
        self._calls(calls)
        return out

    def _meta(self, shape, layouts, coalesce=True):
        """The strided kernels' meta words (tallow.layout.kernel_meta) in a buffer of their own."""
        try:
            words = kernel_meta(shape, layouts, META_DIMS, "wasm", coalesce=coalesce)
        except UnsupportedError:
            self._missing(f"a strided view of shape {tuple(shape)} (more than {META_DIMS} dims after merging)")
        return self.driver.upload(struct.pack(f"<{len(words)}i", *words), None)

    def assign(self, dst, ld, src, ls, dtype):
        if ld.numel() == 0:
            return
        rows_d, rows_s = _row_offsets(ld), _row_offsets(ls)
        size = dtype.itemsize
        if (dtype.is_quantized or rows_d is None or rows_s is None or rows_d[1] != rows_s[1]
                or (rows_d[1] * size) % 4):
            self._missing(f"assign of {dtype.name} {ls} into {ld}")
        n = rows_d[1]
        self._calls([("copy_f32", (src.at(s), n * size // 4, dst.at(d))) for d, s in zip(rows_d[0], rows_s[0])])

    def cast(self, st, layout, src_dtype, dst_dtype):
        if src_dtype is dst_dtype:
            return self.copy(st, layout, src_dtype)
        kernel = {(f16, f32): "f16_to_f32", (f32, f16): "f32_to_f16"}.get((src_dtype, dst_dtype))
        if kernel is None:
            self._missing(f"cast {src_dtype.name} -> {dst_dtype.name}")
        x = self._packed(st, layout, src_dtype)
        n = layout.numel()
        out = self._new(n, dst_dtype)
        if n:
            self._call(kernel, x.at(), n, out.at())
        return out

    def _contiguous_f32(self, op, st, layout, dtype):
        self._check(dtype, op)
        return self._packed(st, layout, dtype)

    def unary(self, op, st, layout, dtype, arg=None):
        if op not in WASM_UNARY:
            self._missing(f"unary {op}")
        self._check(dtype, f"unary {op}")
        a0 = a1 = 0.0
        if op == "clamp":
            lo, hi = arg
            a0 = float("-inf") if lo is None else float(lo)
            a1 = float("inf") if hi is None else float(hi)
        elif op == "affine":
            a0, a1 = float(arg[0]), float(arg[1])
        n = layout.numel()
        out = self._new(n, dtype)
        if n:
            self._call("unary_f32", UNARY_CODES[op], st.at(), out.at(), self._meta(layout.shape, [layout]), a0, a1)
        return out

    def binary(self, op, a, la, b, lb, dtype):
        if op not in WASM_BINARY:
            self._missing(f"binary {op}")
        self._check(dtype, f"binary {op}")
        n = la.numel()
        out = self._new(n, dtype)
        if n:
            self._call("binary_f32", BINARY_CODES[op], a.at(), b.at(), out.at(), self._meta(la.shape, [la, lb]))
        return out

    # ---- reductions, softmax, norms -------------------------------------------------------
    def _reduce_kernel(self, op, st, layout, dtype, dims, plan):
        if op != "argmax" and op not in WASM_REDUCE:
            self._missing(f"reduce {op}")
        x = self._packed(st, plan.layout, dtype)
        if op == "argmax":
            out = self._new(plan.rows, i64)
            self._call("argmax_f32", x.at(), plan.rows, plan.length, out.at())
            return out
        out = self._new(plan.rows, dtype)
        meta = self._meta((plan.rows, plan.length), [Layout((plan.rows, plan.length))], coalesce=False)
        self._call("reduce_f32", REDUCE_CODES[op], x.at(), meta, out.at())
        return out

    def _cumsum_kernel(self, st, layout, dtype, dim, out_dtype):
        self._missing("cumsum")

    def _softmax_kernel(self, st, layout, out, log, dtype):
        if log:
            self._missing("log_softmax")
        n = layout.shape[-1]
        rows = layout.numel() // n
        x = self._packed(st, layout, dtype)
        self._call("softmax_rows", x.at(), rows, n, n, 1.0, -1, out.at())

    def _norm_rows(self, x, r, norm, total, out, dtype):
        """Each row: total = x + r, out = norm(total) (r None: a zero row; total None: scratch)."""
        (xs, lx) = x
        d = lx.shape[-1]
        rows = lx.numel() // d
        xs = self._packed(xs, lx, dtype)
        rs = self._packed(r.storage, r.layout, dtype) if r is not None else None
        zero = self._scratch(4 * d) if rs is None else None
        scratch = self._scratch(4 * d) if total is None else None
        w = 0 if norm.weight is None else self._packed(*norm.weight, dtype).at()
        b = 0 if norm.bias is None else self._packed(*norm.bias, dtype).at()
        calls = []
        for i in range(rows):
            args = [xs.at(i * d), zero if rs is None else rs.at(i * d), w]
            if norm.center:
                args.append(b)
            args += [d, float(norm.eps), scratch if total is None else total.at(i * d), out.at(i * d)]
            calls.append(("add_layer_norm" if norm.center else "add_rms_norm", args))
        self._calls(calls)

    def _norm_kernel(self, x, norm, out, dtype):
        self._norm_rows(x, None, norm, None, out, dtype)

    def _add_norm_kernel(self, x, r, norm, total, out, dtype):
        if x.layout.shape != r.layout.shape:
            self._missing("add + norm with broadcasting")
        self._norm_rows(x, r, norm, total, out, dtype)

    # ---- rotary, KV cache, attention ------------------------------------------------------
    def _rotary_rows(self, rotary, d, position):
        """(cos, sin) arguments for the rows from `position` on (moving with the step while capturing)."""
        args = []
        for table in (rotary.cos, rotary.sin):
            st, lay = table
            if lay.shape[-1] * 2 != d or (len(lay.shape) == 2 and lay.shape[0] > 1 and lay.strides[0] != d // 2) \
                    or lay.strides[-1] != 1:
                self._missing(f"rope with rotary tables laid out as {lay} for head size {d}")
            rel = lay.offset - position * lay.strides[0]
            args.append(self._moving(st.at(rel), lay.strides[0] * 4))
        return args

    def _rope_kernel(self, x, rotary, out, dtype):
        (xs, lx) = x
        b, h, t, d = lx.shape
        calls = self._row_copies(xs, lx, dtype, out)
        if calls is None:
            self._missing(f"rope of a view laid out as {lx}")
        cos, sin = self._rotary_rows(rotary, d, 0)
        self._calls(calls + [("rope_seq", (out.at(i * h * t * d), h, t, d, cos, sin, int(rotary.interleaved)))
                             for i in range(b)])

    def _slot_rows(self, cache, lay, position):
        """Copy destinations for the rows of a cache slot (b, hk, t, d): one per (b, hk, token)."""
        b, hk, t, d = lay.shape
        sb, sh, st_, sd = lay.strides
        if sd != 1:
            self._missing(f"a KV cache laid out as {lay}")
        rel = lay.offset - position * st_
        return [self._moving(cache.at(rel + i * sb + j * sh + k * st_), st_ * 4)
                for i in range(b) for j in range(hk) for k in range(t)]

    def _write_slots(self, src, lsrc, cache, lcache, position, dtype):
        """Copy calls of src (b, hk, t, d) into the cache slots, row by row."""
        rows = _row_offsets(lsrc)
        d = lsrc.shape[-1]
        if rows is None or rows[1] % d:
            self._missing(f"a KV-cache write from a view laid out as {lsrc}")
        # each contiguous run splits into rows of d, one per (batch, kv head, token) in order
        offsets = [o + j * d for o in rows[0] for j in range(rows[1] // d)]
        dst = self._slot_rows(cache, lcache, position)
        return [("copy_f32", (src.at(o), d, at)) for o, at in zip(offsets, dst)]

    def kv_write(self, k, v, slots, dtype):
        self._check(dtype, "kv_write")
        (k, lk), (v, lv), ((kc, lkc), (vc, lvc)) = k, v, slots
        if lk.numel() + lv.numel() == 0:
            return
        pos = self._cache_write_position(kc, vc)
        self._calls(self._write_slots(k, lk, kc, lkc, pos, dtype) + self._write_slots(v, lv, vc, lvc, pos, dtype))

    def rope_kv_write(self, qkv, rotary, slots, dtype):
        self._check(dtype, "rope_kv_write")
        (q, lq), (k, lk), (v, lv) = qkv
        ((kc, lkc), (vc, lvc)) = slots
        b, h, t, d = lq.shape
        hk = lk.shape[1]
        out = self._new(lq.numel(), dtype)
        if out.numel == 0:
            return out
        pos = self._cache_write_position(kc, vc)
        calls = self._row_copies(q, lq, dtype, out)
        if calls is None:
            self._missing(f"rope of queries laid out as {lq}")
        cos, sin = self._rotary_rows(rotary, d, pos)
        inter = int(rotary.interleaved)
        calls += [("rope_seq", (out.at(i * h * t * d), h, t, d, cos, sin, inter)) for i in range(b)]
        calls += self._write_slots(k, lk, kc, lkc, pos, dtype) + self._write_slots(v, lv, vc, lvc, pos, dtype)
        # the keys rotated where they now lie: each (b, kv head)'s t slots are t rows of d in a row
        if lkc.strides[2] != d:
            self._missing(f"a KV cache laid out as {lkc} (rope over its slots needs rows of d in a row)")
        heads = self._slot_rows(kc, lkc, pos)
        calls += [("rope_seq", (heads[(i * hk + j) * t], 1, t, d, cos, sin, inter))
                  for i in range(b) for j in range(hk)]
        self._calls(calls)
        return out

    def cache_attention(self, qkv, cache, rotary, mask, dtype, spec):
        """rope + the KV write + attention over the cache's first position + t slots, by the
        module's cache_attention (one token) or cache_attention_rows (a prompt, causal); GQA."""
        q, k, v = qkv
        (kc, lkc), (vc, lvc) = cache
        b, h, t, d = q.layout.shape
        hk, cap = lkc.shape[1], lkc.shape[2]
        fits = (mask is None and spec.key_start == 0 and v.layout.shape[3] == d and lvc.shape == lkc.shape
                and lkc.strides == lvc.strides == (hk * cap * d, cap * d, d, 1) and lkc.offset == lvc.offset == 0
                and h % hk == 0)
        if not fits:
            self._missing("cache_attention with a mask, a sliding window or caches other than contiguous "
                          "(b, kv_heads, capacity, d)")
        self._check(dtype, "cache_attention")
        position = spec.position
        slots = type(cache)(Operand(kc, lkc.narrow(2, position, t)), Operand(vc, lvc.narrow(2, position, t)))
        if rotary is None:
            self.kv_write(k, v, slots, dtype)
            qs = self._packed(*q, dtype)
        else:
            qs = self.rope_kv_write(qkv, rotary, slots, dtype)
        out = self._new(b * h * t * d, dtype)
        scores = self._scratch(4 * cap)
        scale = float(spec.scale)
        calls = []
        for i in range(b):
            kb, vb = kc.at(i * hk * cap * d), vc.at(i * hk * cap * d)
            qb, ob = qs.at(i * h * t * d), out.at(i * h * t * d)
            if t == 1:
                keys = self._moving(1, 1) if self._capture() is not None else position + 1
                calls.append(("cache_attention", (qb, h, hk, d, kb, vb, cap, keys, scale, scores, ob)))
            else:
                first = self._moving(0, 1) if self._capture() is not None else position
                calls.append(("cache_attention_rows", (qb, h, hk, t, d, kb, vb, cap, first, scale, scores, ob)))
        self._calls(calls)
        return out

    def _attention_unfused(self, q, k, v, mask, dtype, spec):
        """softmax(q k^T * scale + mask) v composed: the scores by gemm_f32, softmax_rows (with the
        scale and the causal mask where there is no additive one), then gemm_f32 by v."""
        self._check(dtype, "attention")
        (_, lq), (ks, lk), (_, lv) = q, k, v
        b, h, tq, _ = lq.shape
        tk, dv = lk.shape[2], lv.shape[3]
        if b * h * tq * dv == 0:
            return self._new(0, dtype)
        if tk == 0:
            return self.full(b * h * tq * dv, 0.0, dtype)
        if mask is None:
            return self._attention_by_head(q, k, v, dtype, spec)
        scores = self.matmul(q, Operand(ks, lk.permute([0, 1, 3, 2])), dtype)
        whole = Layout((b, h, tq, tk))
        scale = float(spec.scale)
        if mask is not None:
            scores = self.unary("affine", scores, whole, dtype, (scale, 0.0))
            scores = self.binary("add", scores, whole, mask.storage, mask.layout, dtype)
            scale = 1.0
        causal = tk - tq if spec.causal else -1
        probs = self._new(b * h * tq * tk, dtype)
        self._calls([("softmax_rows", (scores.at(i * tq * tk), tq, tk, tk, scale, causal, probs.at(i * tq * tk)))
                     for i in range(b * h)])
        return self.matmul(Operand(probs, whole), v, dtype)

    def _attention_by_head(self, q, k, v, dtype, spec):
        """The same calls as the composed path (gemm_f32, softmax_rows, gemm_f32: the same values),
        one head at a time through one (tq, tk) block of scores and one of probabilities reused by
        every head, so the memory holds one head's scores rather than all b * h of them (Whisper's
        30 s encoder window: 2 x 9 MB, not 2 x 54 MB)."""
        (qs, lq), (ks, lk), (vs, lv) = q, k, v
        b, h, tq, d = lq.shape
        tk, dv = lk.shape[2], lv.shape[3]
        if not (lq.strides[-1] == 1 or d == 1):
            qs, lq = self._packed(qs, lq, dtype), Layout(lq.shape)
        if not (lk.strides[-1] == 1 or d == 1):
            ks, lk = self._packed(ks, lk, dtype), Layout(lk.shape)
        vt = lv.permute([0, 1, 3, 2])  # (b, h, dv, tk): v's columns as rows
        if not (vt.strides[-1] == 1 or tk == 1):
            vs, vt = self._packed(vs, vt, dtype), Layout(vt.shape)
        lda = lq.strides[-2] if tq > 1 else d
        ldk = lk.strides[-2] if tk > 1 else d
        ldv = vt.strides[-2] if dv > 1 else tk
        scores, probs = self._new(tq * tk, dtype), self._new(tq * tk, dtype)
        out = self._new(b * h * tq * dv, dtype)
        scratch = self._scratch(4 * GEMM_NR * max(d, tk))
        causal = tk - tq if spec.causal else -1
        calls = []
        for i, (bi, hi) in enumerate(itertools.product(range(b), range(h))):
            oq = lq.offset + bi * lq.strides[0] + hi * lq.strides[1]
            ok = lk.offset + bi * lk.strides[0] + hi * lk.strides[1]
            ov = vt.offset + bi * vt.strides[0] + hi * vt.strides[1]
            calls += [("gemm_f32", (qs.at(oq), lda, ks.at(ok), ldk, 0, scores.at(), tk, tq, tk, d, scratch)),
                      ("softmax_rows", (scores.at(), tq, tk, tk, float(spec.scale), causal, probs.at())),
                      ("gemm_f32", (probs.at(), tk, vs.at(ov), ldv, 0, out.at(i * tq * dv), dv, tq, dv, tk, scratch))]
        self._calls(calls)
        return out

    def _attention_fits(self, lq, lk, lv):
        return False

    def conv1d(self, x, w, dtype, spec):
        """torch's conv1d by conv1d_f32 (im2col + gemm_f32), one call per signal; groups and
        dilation 1 only."""
        self._check(dtype, "conv1d")
        if spec.groups != 1 or spec.dilation != 1:
            self._missing("conv1d with groups or dilation")
        (xs, lx), (ws, lw) = x, w
        b, cin, length = lx.shape
        cout, cin_w, ksize = lw.shape
        if cin_w != cin:
            raise ShapeError(f"wasm conv1d: {cin} input channels, the weight takes {cin_w}")
        t_out = (length + 2 * spec.padding - ksize) // spec.stride + 1
        if t_out <= 0:
            raise ShapeError(f"wasm conv: input {lx.shape} is smaller than the kernel {lw.shape}")
        xs, ws = self._packed(xs, lx, dtype), self._packed(ws, lw, dtype)
        out = self._new(b * cout * t_out, dtype)
        scratch = self._scratch(4 * (t_out * cin * ksize + GEMM_NR * cin * ksize))
        self._calls([("conv1d_f32", (xs.at(i * cin * length), cin, length, ws.at(), cout, ksize, spec.stride,
                                     spec.padding, 0, out.at(i * cout * t_out), scratch)) for i in range(b)])
        return out

    # ---- indexing -----------------------------------------------------------------------
    def _quantized_rows(self, st, layout, dtype, ids, lids, dim):
        if dim != 0 or dtype.name not in BLOCK_BYTES:
            self._missing(f"row lookup in {dtype.name} blocks along dim {dim}")
        rows, k = layout.shape
        row_bytes = k // dtype.block_size * dtype.block_bytes
        blocks = row_bytes // BLOCK_BYTES[dtype.name]
        n = lids.numel()
        out = self._new(n * k, f32)
        if n == 0:
            return out
        cap = self._capture()
        if cap is not None and n == 1 and lids.offset == 0:
            # the step's token: its row moves with the step's token word (overwrite() sets it on replay)
            (token,) = self.to_list(ids, lids, ids.dtype)
            self._token_inputs[ids] = rows
            self._token = token
            self.driver.write(self.driver.step, 4, struct.pack("<i", token))
            self._call(f"dequant_{dtype.name}", StepArg(st.at(), row_bytes, "token"), blocks, self.driver.table,
                       out.at())
            return out
        if cap is not None:
            cap.computed_on_host("row ids read on the host")
        table = self.driver.table
        self._calls([(f"dequant_{dtype.name}", (st.at(int(i) * row_bytes), blocks, table, out.at(j * k)))
                     for j, i in enumerate(self.to_list(ids, lids, ids.dtype))])
        return out

    def _index_select_kernel(self, st, layout, dtype, ids, lids, dim, shape, out):
        """Entries along `dim` of an f32 tensor (or f16, whole words) by rows_f32, one call per index
        of the dims before it (the tensor packed first where it is strided). Other ids than i32 (or
        one i64) are read on the host (a captured step that does this is not replayed)."""
        size = layout.shape[dim]
        outer = _prod(layout.shape[:dim])
        inner = _prod(layout.shape[dim + 1:])
        # f16 entries of whole 4-byte words (an f16 embedding table's rows) are copied as f32 words
        # by the same kernel: the same bytes, half as many words (a lookup, never a computation)
        if not (dtype is f32 or (dtype is f16 and inner % 2 == 0)):
            self._missing(f"index_select of {dtype.name}" + (f" entries of {inner} (whole 4-byte words only)"
                                                             if dtype is f16 else ""))
        words_per = inner if dtype is f32 else inner // 2
        x = self._packed(st, layout, dtype)
        n = lids.numel()
        if (ids.dtype.name == "i32" and lids.is_contiguous()) or (ids.dtype is i64 and n == 1):
            # the kernel reads the ids where they lie (one i64's low word is its i32 value; an id
            # outside the table traps), so a captured step reads a replay's new token itself
            words = ids.at(lids.offset)
        else:
            cap = self._capture()
            if cap is not None:
                cap.computed_on_host("row ids read on the host")
            picked = [int(i) for i in self.to_list(ids, lids, ids.dtype)]
            words = self.driver.upload(struct.pack(f"<{n}i", *picked), None)
        self._calls([("rows_f32", (x.at(i * size * inner), size, words_per, words, n, out.at(i * n * inner)))
                     for i in range(outer)])

    def _gather_kernel(self, st, layout, dtype, ids, lids, dim, out):
        self._missing(f"gather of {dtype.name}")

    def scatter_add(self, dst, ids, src, dtype, dim):
        self._missing("scatter_add")

    def where(self, cond, a, b, dtype):
        self._missing("where")

    def compare(self, op, a, la, b, lb, dtype):
        self._missing(f"compare {op}")

    # ---- products -----------------------------------------------------------------------
    def _product(self, x, w, dtype, out):
        """out (m, n) f32 = x (m, k) . w^T for w a QuantWeight: quantize_row per row, matmul_<fmt>."""
        (xs, lx), (ws, wdtype, n, k) = x, w
        if wdtype.name not in BLOCK_BYTES:
            self._missing(f"a product with {wdtype.name} weights")
        if k % 32:
            self._missing(f"a quantised product over rows of {k} (whole 32-value blocks only)")
        m = lx.numel() // k
        xs = self._packed(xs, lx, dtype)
        qx, dx, sx = self._scratch(2 * m * k), self._scratch(m * k // 8), self._scratch(m * k // 8)
        calls = [("quantize_row", (xs.at(i * k), k, (qx, 2 * i * k), (dx, i * k // 8), (sx, i * k // 8)))
                 for i in range(m)]
        blocks = (k // wdtype.block_size * wdtype.block_bytes) // BLOCK_BYTES[wdtype.name]
        calls.append((f"matmul_{wdtype.name}", (ws.at(), n, blocks, m, qx, dx, sx, self.driver.table, out.at())))
        self._calls(calls)
        return m, n

    def _qmatvec_kernel(self, x, w, dtype, bias=None):
        self._check(dtype, "qmatmul")
        m = x.layout.numel() // w.cols
        out = self._new(m * w.rows, f32)
        self._product(x, w, dtype, out)
        return out

    _qmatmul_kernel = _qmatvec_kernel

    def _reads_blocks(self, w, wdtype, rows, k):
        return wdtype.name in BLOCK_BYTES

    def gated_qmatmul(self, x, w, dtype, act):
        """silu(x . gate^T) * (x . up^T): one product over [gate; up], then silu_mul per row."""
        if act not in self.activations:
            self._missing(f"a gated product with {act}")
        self._check(dtype, "gated_qmatmul")
        m = x.layout.numel() // w.cols
        n = w.rows // 2
        y = self._new(m * 2 * n, f32)
        self._product(x, w, dtype, y)
        out = self._new(m * n, f32)
        self._calls([("silu_mul", (y.at(2 * n * i), y.at(2 * n * i + n), n, out.at(n * i))) for i in range(m)])
        return out

    def matmul(self, a, b, dtype):
        """a (*batch, m, k) . b (*batch, k, n) by gemm_f32 (C = A . B^T for B (n, k): b's columns as
        rows), one call per batch index; a or b is packed first where its rows are not contiguous.
        b held as f16 (f16_weight_products: a Linear's f16 weight, a's f32 rows): gemm_f16 reads it
        where it lies, widening each value exactly in the kernel, so the product equals gemm_f32's
        on the widened weight and the weight is never copied to f32."""
        self._check(dtype, "matmul")
        (ast, la), (bst, lb) = a, b
        kernel, bdtype = "gemm_f32", dtype
        if bst.dtype is f16 and ast.dtype is f32:
            kernel, bdtype = "gemm_f16", f16
        elif bst.dtype is not dtype or ast.dtype is not dtype:
            self._missing(f"matmul of {ast.dtype.name} by {bst.dtype.name} into {dtype.name}")
        *batch, m, k = la.shape
        n = lb.shape[-1]
        count = _prod(batch)
        out = self._new(m * n * count, dtype)
        if m * n * count == 0 or k == 0:
            return out  # zeroed: a sum of nothing
        if not (la.strides[-1] == 1 or k == 1):
            ast, la = self._packed(ast, la, dtype), Layout(la.shape)
        bt = lb.permute(list(range(len(batch))) + [len(batch) + 1, len(batch)])  # (*batch, n, k)
        if kernel == "gemm_f16" and m > GEMM_ROW_BLOCK:
            # gemm_f16 widens each weight panel again for every block of rows of A (24 rows at k = 384);
            # with more rows one exact widening into a transient f32 copy and gemm_f32 give the same
            # values sooner (the encoder's 1500-row products; a decoding step's rows stay on gemm_f16)
            bst, bt = self.cast(bst, bt, f16, f32), Layout(bt.shape)
            kernel, bdtype = "gemm_f32", f32
        if not (bt.strides[-1] == 1 or k == 1):
            bst, bt = self._packed(bst, bt, bdtype), Layout(bt.shape)
        lda = la.strides[-2] if m > 1 else k
        ldb = bt.strides[-2] if n > 1 else k
        scratch = self._scratch(4 * GEMM_NR * k)
        calls = []
        for i, idx in enumerate(itertools.product(*[range(d) for d in batch])):
            oa = la.offset + sum(j * s for j, s in zip(idx, la.strides))
            ob = bt.offset + sum(j * s for j, s in zip(idx, bt.strides))
            calls.append((kernel, (ast.at(oa), lda, bst.at(ob), ldb, 0, out.at(i * m * n), n, m, n, k, scratch)))
        self._calls(calls)
        return out

    def dequantize(self, w, wdtype, numel, dtype):
        self._missing(f"dequantize {wdtype.name}")

    def conv2d(self, x, w, dtype, spec):
        self._missing("conv2d")


    def custom(self, op, inputs, out_shape, out_dtype):
        raise UnsupportedError(f"custom op {op.name!r} has no implementation for the wasm device")


assert set(BLOCK_BYTES) <= {name[len("matmul_"):] for name in OPCODES if name.startswith("matmul_")}
