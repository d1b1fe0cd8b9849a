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
import struct
import sys
from array import array

from tallow.backends.gpu_backend import GpuBackend
from tallow.backends.gpu_plan import IN_KERNEL_QUANTS, MAX_DIMS, f32_bits, in_kernel_quant, runs_matvec
from tallow.backends.step_buffer import STEP_BYTES
from tallow.dtypes import bf16, bool_, f16, f32, i32, i64, u8, u32
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout, coalesce_dims, contiguous_strides, kernel_meta, numel_of

from . import expressions as ex
from . import split, tuning, wgsl
from .recording import STEP_CAPTURED, STEP_EAGER, entry_signature

# Up to this many rows of x (decoding, short prefills) quantised matmuls run
# qmatvec: 4 columns per invocation share each load of x, and the weight rows
# are re-read per row of x. Measured on lavapipe it beats qmatmul (4 rows
# share each dequantised block) 4-20x from m = 1 to m = 32 (gpu_plan.runs_matvec); qmatmul serves
# long prompts, where one qmatvec dispatch would run for very long (qmatmul.wgsl
# or the workgroup-tiled qmatmul_tiled.wgsl: tuning.py measures which per adapter).
QMATVEC_MAX_ROWS = 64
# add_norm_linear keeps its normed row in workgroup memory: 16 KiB (every adapter's minimum
# maxComputeWorkgroupStorageSize) less row_sum's 64 floats. Longer rows take two dispatches.
NORM_INPUT_MAX_K = (16384 - 256) // 4
# Up to this many query rows per (batch, head) attention runs as one kernel (kernels/attend.wgsl)
# reading the KV cache directly; longer prompts keep scores, softmax and weighted sum as three
# dispatches, whose matmuls share loads between rows.
ATTEND_MAX_ROWS = 16
# Split-K (flash-decoding) for one-token attention over a long KV cache: one workgroup per
# query head leaves most of a real GPU idle (SmolLM2: 9 workgroups), so a cache of at least
# SPLIT_K_MIN_KEYS slots has its keys split among workgroups of KEYS_PER_SPLIT (at most
# MAX_SPLITS), and a second small dispatch joins their partial softmaxes. The split count comes
# from the cache's capacity, never its length, so a captured step replays at any position
# (empty splits weigh nothing). Not tuned on the CPU-emulated adapters.
SPLIT_K_MIN_KEYS = 1024
KEYS_PER_SPLIT = 256
MAX_SPLITS = 64
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def probe():
    """Features of the wgpu device here, or DeviceError saying why there is none."""
    return WgpuBackend().features()


class WgpuStorage:
    """A GPU buffer holding `nbytes` of one tensor's elements. `dequantized` marks
    block-format weights that were dequantised to f32 on upload."""
    __slots__ = ("buf", "cap", "nbytes", "dequantized", "__weakref__")

    def __init__(self, buf, cap, nbytes, dequantized=False):
        self.buf, self.cap, self.nbytes, self.dequantized = buf, cap, nbytes, dequantized

    def __repr__(self):
        return f"WgpuStorage({self.nbytes} bytes)"


def _u32(v):
    return v & 0xFFFFFFFF


def _pack(words):
    return struct.pack(f"<{len(words)}I", *[_u32(w) for w in words])


def _layout_words(shape, operands, coalesce=True, what="op"):
    """Words 0..36 of the element-wise layout (see kernels/common.wgsl): numel, then the
    strided-kernel meta of tallow.layout.kernel_meta with three operand slots."""
    return [numel_of(shape)] + kernel_meta(shape, operands, MAX_DIMS, f"wgpu {what}", slots=3, coalesce=coalesce)


def _contig_strides(shape):
    return list(contiguous_strides(tuple(shape)))


# The matvec kernels' output activation when there is none.
_NO_ACT = {"ACT": "v"}
# qmatvec*.wgsl read x through input_strided.wgsl, a block at a time (qmatvec_block.wgsl).
_QMATVEC_INPUT = ("input_strided", "qmatvec_block")


def _qmatvec_words(m, n, k, row_bytes, xoff):
    """Words 0..11 of qmatvec*.wgsl: m rows of x, contiguous from xoff, times n rows of k of w."""
    return [m, n, k, row_bytes, xoff, 0, k, 1, 0, 0, 0, 0]


class WgpuBackend(GpuBackend):
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

    # ---- memory -----------------------------------------------------------------
    def _upload(self, data):
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        n = len(mv)
        st = self._alloc(n)
        if n:
            payload = mv if n % 4 == 0 else bytes(mv) + bytes(-n % 4)
            self.driver.write(st.buf, 0, payload)
        return st

    def _widen(self, raw, numel, dtype, expr):
        out = self._new(numel, dtype)
        if numel:
            self._run("unpack", {"Y": dtype}, [raw, out], self._params([numel], []), (numel + 255) // 256,
                      {"EXPR": expr}, label=f"unpack {dtype.name}")
        return out

    def from_bytes(self, data, dtype):
        if dtype.is_quantized:
            if in_kernel_quant(dtype):
                return self._upload(data)
            return self._dequantize_on_upload(data, dtype)
        mv = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
        self._check_whole_elements(len(mv), dtype)
        numel = len(mv) // dtype.itemsize
        st_type = wgsl.storage_type(dtype, self.has_f16)
        if dtype is i64:
            vals = array("q")
            vals.frombytes(mv)
            self._check_i32(vals, "from_bytes")
            return self._upload(array("i", vals).tobytes())
        if dtype.itemsize == 4 or (dtype is f16 and st_type == "f16"):
            st = self._upload(mv)
            st.nbytes = numel * dtype.itemsize
            return st
        return self._widen_raw(self._upload(mv), numel, dtype)

    def from_js_buffer(self, array_buffer, offset, nbytes, dtype):
        """Storage for nbytes of a JS ArrayBuffer at offset (a fetched weights file in the browser),
        copied into the GPU buffer in JS without entering the wasm heap; then widened on the GPU like
        from_bytes. None when that cannot be done (not the browser driver, or a dtype that needs the
        CPU: i64's range check, quantisations the kernels do not read): read the bytes and use from_bytes."""
        if (not self.driver.reads_js_buffers or dtype is i64
                or (dtype.is_quantized and not in_kernel_quant(dtype))):
            return None
        if not dtype.is_quantized and nbytes % dtype.itemsize:
            raise ShapeError(f"wgpu from_js_buffer: {nbytes} bytes is not a whole number of {dtype.name} elements")
        raw = self._alloc(nbytes)
        if nbytes:
            self.driver.write_from_js(raw.buf, 0, array_buffer, offset, nbytes)
        if (dtype.is_quantized or dtype.itemsize == 4
                or (dtype is f16 and wgsl.storage_type(dtype, self.has_f16) == "f16")):
            return raw
        return self._widen_raw(raw, nbytes // dtype.itemsize, dtype)

    def _widen_raw(self, raw, numel, dtype):
        """f32/i32/u32 storage from packed 1- or 2-byte elements already on the GPU."""
        if dtype is f16:
            expr = "unpack2x16float(half_of(i)).x"
        elif dtype is bf16:
            expr = "bitcast<f32>(half_of(i) << 16u)"
        elif dtype.kind == "i":
            expr = "bitcast<i32>(byte_of(i) << 24u) >> 24u"
        elif dtype is bool_:
            expr = "select(0u, 1u, byte_of(i) != 0u)"
        else:
            expr = "byte_of(i)"
        return self._widen(raw, numel, dtype, expr)

    def _dequantize_on_upload(self, data, dtype):
        from tallow.backends.host import dequantize_on_host
        numel = len(memoryview(data).cast("B")) // dtype.block_bytes * dtype.block_size
        st = self._upload(dequantize_on_host(data, dtype, numel))
        st.dequantized = True
        return st

    def _exact_i64(self, what, out_shape, compute):
        """An i64 op whose result may leave the i32 range that i64 is kept in here: computed exactly
        (64 bits) on the host backend, and kept only when every value fits; else UnsupportedError,
        never a 32-bit wrap-around. compute(host, up) runs the op on the host, up(st, layout, dtype)
        moving an operand there."""
        from tallow.backends.host import host_device
        host = host_device().backend
        cap = self._capture()
        if cap is not None:  # computed from the step's own data: a replay would upload stale values
            cap.computed_on_host(f"wgpu {what} (i64, exactly on the host)")

        def up(st, layout, dtype):
            return host.from_bytes(self.to_bytes(st, layout, dtype), dtype), Layout(layout.shape)

        vals = array("q")
        vals.frombytes(host.to_bytes(compute(host, up), Layout(tuple(out_shape)), i64))
        if len(vals) and (min(vals) < I32_MIN or max(vals) > I32_MAX):
            raise UnsupportedError(f"wgpu {what}: the i64 result leaves the i32 range (min {min(vals)}, max "
                                   f"{max(vals)}), and the wgpu backend keeps i64 as i32; compute it on the cpu "
                                   "device, or in f32")
        return self._upload(array("i", vals).tobytes())

    @staticmethod
    def _check_i32(vals, what):
        if len(vals) and (min(vals) < I32_MIN or max(vals) > I32_MAX):
            raise UnsupportedError(f"wgpu {what}: i64 values outside the i32 range (min {min(vals)}, max {max(vals)}); "
                                   "the wgpu backend stores i64 as i32")

    def _read(self, st, offset_bytes, nbytes):
        if nbytes == 0:
            return b""
        return self.driver.download(st.buf, offset_bytes, nbytes)

    def concat_rows(self, parts, dtype):
        """Buffer-to-buffer copies on the GPU: joined weights never pass through Python memory."""
        spans = []
        for st, lay in parts:
            if dtype.is_quantized and not st.dequantized:
                start, nbytes = lay.offset // dtype.block_size * dtype.block_bytes, dtype.nbytes(lay.numel())
            else:
                size = 4 if dtype.is_quantized else self._esize(dtype)
                start, nbytes = lay.offset * size, lay.numel() * size
            spans.append((st, start, nbytes))
        if any(start % 4 or nbytes % 4 for _, start, nbytes in spans):  # copies move whole words
            return super().concat_rows(parts, dtype)
        out = self._alloc(sum(nbytes for _, _, nbytes in spans))
        out.dequantized = bool(parts) and parts[0][0].dequantized
        pos = 0
        for st, start, nbytes in spans:
            if nbytes:
                self.driver.copy(st.buf, start, out.buf, pos, nbytes)
            pos += nbytes
        return out

    def to_bytes(self, st, layout, dtype):
        numel = layout.numel()
        if dtype.is_quantized:
            if st.dequantized:
                raise UnsupportedError(f"wgpu to_bytes: {dtype.name} weights were dequantised on upload; "
                                       "their blocks are not kept on the GPU")
            start = layout.offset // dtype.block_size * dtype.block_bytes
            return self._read(st, start, dtype.nbytes(numel))
        if numel == 0:
            return b""
        src, off = self._contiguous(st, layout, dtype)
        esize = self._esize(dtype)
        if dtype is i64:
            vals = array("i")
            vals.frombytes(self._read(src, off * 4, numel * 4))
            return array("q", vals).tobytes()
        if dtype.itemsize == esize:
            return self._read(src, off * esize, numel * esize)
        if off:
            src, off = self.copy(src, Layout((numel,), (1,), off), dtype), 0
        per_word = 4 // dtype.itemsize
        nwords = (numel + per_word - 1) // per_word
        prelude = ""
        if dtype is f16:
            expr, prelude = "f16_bits(item(2u * j)) | (f16_bits(item(2u * j + 1u)) << 16u)", ex.F16_BITS
        elif dtype is bf16:
            expr = "(bitcast<u32>(item(2u * j)) >> 16u) | (bitcast<u32>(item(2u * j + 1u)) & 0xffff0000u)"
        else:
            expr = ("(bitcast<u32>(item(4u * j)) & 255u) | ((bitcast<u32>(item(4u * j + 1u)) & 255u) << 8u) | "
                    "((bitcast<u32>(item(4u * j + 2u)) & 255u) << 16u) | (bitcast<u32>(item(4u * j + 3u)) << 24u)")
        out = self._alloc(nwords * 4)
        self._run("pack", {"X": dtype}, [src, out], self._params([numel], [nwords]), (nwords + 255) // 256,
                  {"EXPR": expr}, label=f"pack {dtype.name}", prelude=prelude)
        return self._read(out, 0, numel * dtype.itemsize)

    def from_list(self, values, dtype):
        values = list(values)
        if dtype.is_float:
            base, code = f32, "f"
        elif dtype.kind == "i":
            base, code = i32, "i"
            if dtype is i64:
                self._check_i32(values, "from_list")
        else:
            base, code = u32, "I"
            if dtype is bool_:
                values = [1 if v else 0 for v in values]
        st = self._upload(array(code, values).tobytes())
        if base is dtype or (dtype is i64):
            return st
        return self.cast(st, Layout((len(values),)), base, dtype)

    def to_list(self, st, layout, dtype):
        numel = layout.numel()
        if numel == 0:
            return []
        if dtype.is_quantized:
            raise UnsupportedError(f"wgpu to_list: dequantise the {dtype.name} tensor first")
        if dtype is f16 and self.has_f16:
            st, layout, dtype = self.cast(st, layout, f16, f32), Layout((numel,)), f32
        src, off = self._contiguous(st, layout, dtype)
        code = {"f32": "f", "i32": "i", "u32": "I"}[wgsl.compute_type(dtype)]
        vals = array(code)
        vals.frombytes(self._read(src, off * 4, numel * 4))
        if dtype is bool_:
            return [v != 0 for v in vals]
        return vals.tolist()

    def full(self, numel, value, dtype):
        return self._fill(numel, value, 0, dtype)

    def arange(self, start, step, numel, dtype):
        return self._fill(numel, start, step, dtype)

    def _fill(self, numel, start, step, dtype):
        out = self._new(numel, dtype)
        if numel == 0:
            return out
        if dtype.is_float:
            words, value = [f32_bits(start), f32_bits(step)], "PF(37u) + PF(38u) * f32(i)"
        else:
            start, step = int(start), int(step)
            last = start + step * (numel - 1)
            if dtype is i64:
                self._check_i32([start, last], "full/arange")
            words = [start, step]
            value = "PI(37u) + PI(38u) * i32(i)" if dtype.kind == "i" else "P(37u) + P(38u) * i"
        self._run("fill", {"Y": dtype}, [out], self._params([numel], words), (numel + 255) // 256,
                  {"VALUE": value}, label=f"fill {dtype.name}")
        return out

    # ---- element-wise -------------------------------------------------------------
    def copy(self, st, layout, dtype):
        return self._map("identity", st, layout, dtype, dtype, "v")

    def assign(self, dst, ld, src, ls, dtype):
        if ld.numel() == 0:
            return
        if src is dst:  # one buffer cannot be bound for reading and writing at once
            src, ls = self.copy(src, ls, dtype), Layout(ls.shape)
        self._ew("assign", "assign", {"X": dtype}, [(src, ls.offset, ls.strides), (dst, ld.offset, ld.strides)],
                 None, ld.shape)

    def _map(self, label, st, layout, src, dst, expr, extras=(), prelude=""):
        out = self._new(layout.numel(), dst)
        self._ew("unary", label, {"X": src, "Y": dst}, [(st, layout.offset, layout.strides)], out, layout.shape,
                 extras, {"OP": expr}, prelude)
        return out

    def cast(self, st, layout, src_dtype, dst_dtype):
        if src_dtype.is_quantized or dst_dtype.is_quantized:
            raise UnsupportedError(f"wgpu cast {src_dtype.name} -> {dst_dtype.name}: use dequantize / quantize")
        if dst_dtype is i64 and (src_dtype.is_float or src_dtype is u32):  # values beyond i32 come from these
            return self._exact_i64(f"cast {src_dtype.name} -> i64", layout.shape,
                                   lambda host, up: host.cast(*up(st, layout, src_dtype), src_dtype, i64))
        return self._map(f"cast {src_dtype.name}->{dst_dtype.name}", st, layout, src_dtype, dst_dtype,
                         ex.convert_expr(src_dtype, dst_dtype))

    def unary(self, op, storage, layout, dtype, arg=None):
        extras = []
        if op == "clamp":
            lo, hi = arg
            op = "clamp" if lo is not None and hi is not None else "clamp_lo" if lo is not None else "clamp_hi" \
                if hi is not None else "identity"
            arg = (lo if lo is not None else 0, hi if hi is not None else 0)
        if dtype.is_float:
            table, conv, prelude = ex.FLOAT_UNARY, f32_bits, ex.MATH
        else:
            table, conv, prelude = ex.INT_UNARY, int, ex.IPOW
        expr = table.get(op)
        if op == "sign" and dtype.kind in "ub":  # no -1 in an unsigned type
            expr = "select(CX(0), CX(1), v > CX(0))"
        if expr is None:
            raise UnsupportedError(f"the wgpu backend has no unary {op} for {dtype.name}")
        if dtype is i64 and op in ex.I64_MAY_OVERFLOW:
            return self._exact_i64(f"unary {op}", layout.shape,
                                   lambda host, up: host.unary(op, *up(storage, layout, dtype), dtype, arg))
        if op in ("clamp", "clamp_lo", "clamp_hi", "affine"):
            extras = [conv(a) for a in arg]
        elif op == "pow_scalar":
            if not dtype.is_float and int(arg) != arg:
                raise UnsupportedError(f"wgpu pow_scalar: {dtype.name} tensor with a non-integer exponent {arg}")
            extras = [conv(arg)]
        out_dtype = bool_ if op == "logical_not" else dtype
        return self._map(op, storage, layout, dtype, out_dtype, expr, extras, prelude)

    def binary(self, op, a, la, b, lb, dtype):
        table, prelude = (ex.FLOAT_BINARY, ex.MATH) if dtype.is_float else (ex.INT_BINARY, ex.IPOW)
        expr = table.get(op)
        if expr is None:
            raise UnsupportedError(f"the wgpu backend has no binary {op}")
        if dtype is i64 and op in ex.I64_MAY_OVERFLOW:
            return self._exact_i64(f"binary {op}", la.shape,
                                   lambda host, up: host.binary(op, *up(a, la, dtype), *up(b, lb, dtype), dtype))
        return self._binary(op, expr, a, la, b, lb, dtype, dtype, prelude)

    def _binary(self, label, expr, a, la, b, lb, dtype, out_dtype, prelude=""):
        out = self._new(la.numel(), out_dtype)
        self._ew("binary", label, {"X": dtype, "Y": out_dtype},
                 [(a, la.offset, la.strides), (b, lb.offset, lb.strides)], out, la.shape, (), {"OP": expr}, prelude)
        return out

    def compare(self, op, a, la, b, lb, dtype):
        sym = ex.COMPARE.get(op)
        if sym is None:
            raise UnsupportedError(f"the wgpu backend has no compare {op}")
        return self._binary(op, f"select(0u, 1u, {sym})", a, la, b, lb, dtype, bool_)

    def where(self, cond, lc, a, la, b, lb, dtype):
        out = self._new(la.numel(), dtype)
        cdtype = bool_
        self._ew("where", "where", {"C": cdtype, "X": dtype},
                 [(cond, lc.offset, lc.strides), (a, la.offset, la.strides), (b, lb.offset, lb.strides)],
                 out, la.shape)
        return out

    # ---- reductions -----------------------------------------------------------------
    def _reduce_kernel(self, op, storage, layout, dtype, dims, plan):
        out_dtype, outputs, r_count, perm = plan
        arg = op in ("argmax", "argmin")
        if out_dtype is i64 and not arg and (dtype.itemsize >= 4 or op == "prod" or r_count >= ex.SMALL_INT_SUMS):
            return self._exact_i64(f"reduce {op}", perm.shape[:len(perm.shape) - len(dims)],
                                   lambda host, up: host.reduce(op, *up(storage, layout, dtype), dtype, dims))
        out = self._new(outputs, out_dtype)
        ca = wgsl.compute_type(dtype)
        big = {"f32": "f32_inf()", "i32": "2147483647", "u32": "0xffffffffu"}[ca]
        small = {"f32": "-f32_inf()", "i32": "i32(-2147483647 - 1)", "u32": "0u"}[ca]
        init = {"sum": "CA(0)", "prod": "CA(1)", "max": small, "min": big, "argmax": small, "argmin": big}[op]
        combine = {"sum": "acc + v", "prod": "acc * v", "max": "max(acc, v)", "min": "min(acc, v)"}.get(op, "acc")
        cmp = "<" if op == "argmin" else ">"
        better = f"v2 {cmp} v || (v2 == v && i2 < i)"
        if dtype.is_float:  # as numpy: max/min are NaN when a NaN is reduced; argmax/argmin pick the first NaN
            nan_acc, nan_v, nan_v2 = ex.is_nan("acc"), ex.is_nan("v"), ex.is_nan("v2")
            if op in ("max", "min"):
                combine = f"select({combine}, acc + v, {nan_acc} || {nan_v})"
            better = f"({nan_v2} && (!{nan_v} || i2 < i)) || (!{nan_v} && !{nan_v2} && ({better}))"
        subs = {"CA": ca, "INIT": init, "COMBINE": combine, "ARG": "true" if arg else "false",
                "BETTER": better,
                "WRITE": "y[o] = sy(i32(si[0]));" if arg else "y[o] = sy(CY(sv[0]));"}
        words = _layout_words(perm.shape, [perm], True, op)
        self._run("reduce", {"X": dtype, "Y": out_dtype}, [storage, out], self._params(words, [r_count, outputs]),
                  outputs, subs, label=f"reduce {op}")
        return out

    def _cumsum_kernel(self, storage, layout, dtype, dim, out_dtype):
        numel = layout.numel()
        if out_dtype is i64 and (dtype.itemsize >= 4 or layout.shape[dim] >= ex.SMALL_INT_SUMS):
            return self._exact_i64("cumsum", layout.shape,
                                   lambda host, up: host.cumsum(*up(storage, layout, dtype), dtype, dim))
        out = self._new(numel, out_dtype)
        order, perm = layout.moved_last((dim,))
        out_strides = _contig_strides(layout.shape)
        words = _layout_words(perm.shape, [perm, (0, [out_strides[d] for d in order])],
                              False, "cumsum")
        length = layout.shape[dim]
        lines = numel // length
        self._run("cumsum", {"X": dtype, "Y": out_dtype}, [storage, out], self._params(words, [length, lines]),
                  (lines + 63) // 64, label="cumsum")
        return out

    # ---- linear algebra ----------------------------------------------------------------
    def _batched(self, st, layout, dtype):
        """(storage, offset, batch stride, row stride, col stride) with the batch dims merged."""
        shape, strides = layout.shape, layout.strides
        batch, (bstrides,) = coalesce_dims(shape[:-2], [strides[:-2]])
        if len(batch) > 1:  # batch dims that do not merge into one stride: copy them contiguous
            st, layout = self.copy(st, layout, dtype), Layout(shape)
            strides = layout.strides
            batch, (bstrides,) = coalesce_dims(shape[:-2], [strides[:-2]])
        bstride = bstrides[-1] if batch else 0
        return st, layout.offset, bstride, strides[-2], strides[-1]

    def matmul(self, a, la, b, lb, dtype):
        if dtype is i64:
            return self._exact_i64("matmul", la.shape[:-1] + lb.shape[-1:],
                                   lambda host, up: host.matmul(*up(a, la, dtype), *up(b, lb, dtype), dtype))
        m, k = la.shape[-2:]
        n = lb.shape[-1]
        batch = numel_of(la.shape[:-2])
        out = self._new(batch * m * n, dtype)
        if batch * m * n == 0:
            return out
        if batch > self.limits["max_workgroups_per_dim"]:
            raise UnsupportedError(f"wgpu matmul: {batch} batches exceed maxComputeWorkgroupsPerDimension "
                                   f"({self.limits['max_workgroups_per_dim']})")
        a_st, a_off, a_bs, a_rs, a_cs = self._batched(a, la, dtype)
        b_st, b_off, b_bs, b_rs, b_cs = self._batched(b, lb, dtype)
        if not self._fits_binding(b_st):
            return self._matmul_column_pieces(out, a_st, [a_off, a_bs, a_rs, a_cs], b_st, b_off, b_bs, b_rs, b_cs,
                                              m, n, k, batch, dtype)
        words = [m, n, k, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs]
        self._matmul_dispatch(a_st, b_st, out, words, dtype)
        return out

    @staticmethod
    def _takes_matvec_rows(words):
        """Whether matvec_rows.wgsl takes this matmul: one row times w^T whose rows read as vec4s."""
        m, n, k, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs = words
        return m == 1 and b_rs == 1 and k % 4 == 0 and b_off % 4 == 0 and b_bs % 4 == 0 and b_cs % 4 == 0

    def _matmul_dispatch(self, a_st, b_st, out, words, dtype, bias=None):
        """bias: (storage, offset, stride) added to each column, only where _takes_matvec_rows(words)."""
        m, n, k, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs = words
        if self._takes_matvec_rows(words):
            # Decoding through a Linear layer (b = w^T): rows of w read as vec4s.
            bias_st, bias_words = (a_st, [0, 0, 0]) if bias is None else (bias[0], [1, bias[1], bias[2]])
            self._run("matvec_rows", {"X": dtype}, [b_st, a_st, out, bias_st], words + bias_words,
                      ((n + 255) // 256, 1, batch), _NO_ACT, ("input_strided",), label="matvec")
        elif m == 1:
            self._run("matvec", {"X": dtype}, [a_st, b_st, out], words, ((n + 63) // 64, 1, batch), label="matvec")
        else:
            # Prefill and encoder matmuls: the kernel measured fastest on this adapter (tuning.py).
            family = f"matmul {wgsl.storage_type(dtype, self.has_f16)}"
            choice = self.tuning.choice(family) if dtype.is_float else "simple"
            self._matmul_with(choice, a_st, b_st, out, words, dtype)

    @staticmethod
    def _rows_vec4(words):
        """Whether a's rows and b's columns read as vec4s: x . w^T and q . k^T, aligned."""
        m, n, k, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs = words
        aligned = all(v % 4 == 0 for v in (a_off, a_bs, a_rs, b_off, b_bs, b_cs))
        return a_cs == 1 and b_rs == 1 and k % 4 == 0 and aligned

    def _matmul_with(self, choice, a_st, b_st, out, words, dtype):
        """y = a . b for m > 1 by kernel `choice`: "simple" (matmul_rows / matmul.wgsl) or a tile
        configuration of matmul_tiled.wgsl (tuning.TILES)."""
        m, n, k, batch = words[:4]
        vec4 = self._rows_vec4(words)
        if choice == "simple":
            kernel = "matmul_rows" if vec4 else "matmul"
            self._run(kernel, {"X": dtype}, [a_st, b_st, out], words, ((n + 31) // 32, (m + 31) // 32, batch),
                      label=kernel)
            return
        bm, bn, _ = tuning.TILES[choice]
        loads = "tile_load_vec4" if vec4 else "tile_load_strided"
        grid = ((n + bn - 1) // bn, (m + bm - 1) // bm, batch)
        self._run("matmul_tiled", {"X": dtype}, [a_st, b_st, out], words, grid, tuning.tile_subs(choice), (loads,),
                  f"matmul {choice}")

    def _matmul_column_pieces(self, out, a_st, a_words, b_st, b_off, b_bs, b_rs, b_cs, m, n, k, batch, dtype):
        """a . b with b larger than one binding: b's columns (a Linear weight's rows, when b = w^T)
        in pieces that each fit a binding, each piece's output columns copied into place."""
        limit, align, esize = self.limits["max_storage_binding"], self.limits["storage_align"], self._esize(dtype)
        if batch > 1 and b_bs:
            raise UnsupportedError(f"wgpu matmul: a batched right operand of {b_st.nbytes} bytes exceeds the storage "
                                   f"binding limit ({limit} bytes); only a shared (weight) matrix is split")
        if b_cs <= (k - 1) * b_rs:
            raise UnsupportedError(f"wgpu matmul: a {b_st.nbytes}-byte right operand exceeds the storage binding "
                                   f"limit ({limit} bytes) and its columns are not stored apart (strides {b_rs}, "
                                   f"{b_cs}); store it as (n, k) rows, as Linear weights are")
        per = (limit - align) // (b_cs * esize)
        if per == 0:
            raise UnsupportedError(f"wgpu matmul: one column of {b_cs * esize} bytes exceeds the storage binding "
                                   f"limit ({limit} bytes)")
        for j0 in range(0, n, per):
            cols = min(per, n - j0)
            first = b_off + j0 * b_cs  # element where this piece starts
            start = first * esize // align * align
            end = (first + (cols - 1) * b_cs + (k - 1) * b_rs + 1) * esize
            y = self._new(batch * m * cols, dtype)
            words = [m, cols, k, batch, *a_words, first - start // esize, 0, b_rs, b_cs]
            self._matmul_dispatch(a_st, self._bind_range(b_st, start, end - start), y, words, dtype)
            self._place_columns(y, out, batch * m, cols, n, j0, dtype)
        return out

    def _quant_kernel(self, wdtype, what):
        if not in_kernel_quant(wdtype):
            raise UnsupportedError(f"wgpu {what}: no in-kernel decoder for {wdtype.name}")
        return ("quant_common", wdtype.name)

    def _qmatvec_kernel(self, x, lx, dtype, w, wdtype, n, k):
        m = lx.numel() // k
        out = self._new(m * n, dtype)
        xs, xoff = self._contiguous(x, lx, dtype)
        self._qmatmul_piece(w, xs, out, m, n, k, wdtype.nbytes(k), xoff, dtype, wdtype,
                            self._quant_kernel(wdtype, "quantised matmul"))
        return out

    def _qmatmul_kernel(self, x, lx, dtype, w, wdtype, n, k):
        """Many rows (qmatmul.wgsl or the tiled kernel tuning.py picked), a weight bound in pieces
        (each piece's matvec or matmul into its columns), or blocks dequantised on upload."""
        m = lx.numel() // k
        if w.dequantized:
            return self._qmatmul_dequantized(x, lx, dtype, w, n, k, m)
        extra = self._quant_kernel(wdtype, "quantised matmul")
        if k % 32:
            raise ShapeError(f"wgpu quantised matmul: k = {k} is not a multiple of 32")
        out = self._new(m * n, dtype)
        xs, xoff = self._contiguous(x, lx, dtype)
        row_bytes = wdtype.nbytes(k)
        pieces = split.row_pieces(n, row_bytes, self.limits["max_storage_binding"], self.limits["storage_align"],
                                  f"quantised matmul {wdtype.name}")
        for r0, r1 in pieces:
            # One piece of w's rows is one slice of y's columns; a split weight computes each
            # slice into its own buffer and copies it into place.
            cols = r1 - r0
            y = out if len(pieces) == 1 else self._new(m * cols, dtype)
            wb = self._bind_range(w, r0 * row_bytes, cols * row_bytes)
            self._qmatmul_piece(wb, xs, y, m, cols, k, row_bytes, xoff, dtype, wdtype, extra)
            if y is not out:
                self._place_columns(y, out, m, cols, n, r0, dtype)
        return out

    def _qmatmul_piece(self, wb, xs, y, m, n, k, row_bytes, xoff, dtype, wdtype, extra, bias=None):
        """bias: (storage, offset, stride) added to each column, only where m <= QMATVEC_MAX_ROWS."""
        if runs_matvec(m, QMATVEC_MAX_ROWS):
            bias_st, bias_words = (xs, [0, 0, 0]) if bias is None else (bias[0], [1, bias[1], bias[2]])
            words = _qmatvec_words(m, n, k, row_bytes, xoff) + bias_words
            self._run("qmatvec", {"X": dtype}, [wb, xs, y, bias_st], words, self._grid((n + 255) // 256, "qmatvec"),
                      _NO_ACT, extra + _QMATVEC_INPUT, f"qmatvec {wdtype.name}")
        else:
            choice = self.tuning.choice(f"qmatmul {wdtype.name}")
            self._qmatmul_with(choice, wb, xs, y, m, n, k, row_bytes, xoff, dtype, wdtype)

    def _qmatmul_with(self, choice, wb, xs, y, m, n, k, row_bytes, xoff, dtype, wdtype):
        """Quantised prefill (m > QMATVEC_MAX_ROWS) by kernel `choice`: "simple" (qmatmul.wgsl) or a
        tile configuration of qmatmul_tiled.wgsl."""
        words, extra = [m, n, k, row_bytes, xoff], ("quant_common", wdtype.name)
        if choice == "simple":
            self._run_quant("qmatmul", {"X": dtype}, [wb, xs, y], words, ((n + 63) // 64, (m + 3) // 4, 1), extra,
                            f"qmatmul {wdtype.name}")
            return
        bm, bn, _ = tuning.TILES[choice]
        self._run("qmatmul_tiled", {"X": dtype}, [wb, xs, y], words, ((n + bn - 1) // bn, (m + bm - 1) // bm, 1),
                  tuning.tile_subs(choice, 16), extra, f"qmatmul {choice} {wdtype.name}")

    def _place_columns(self, piece, out, m, cols, n, first, dtype):
        """out[:, first:first + cols] = piece, for an (m, cols) piece of an (m, n) output."""
        self._ew("assign", "assign", {"X": dtype}, [(piece, 0, [cols, 1]), (out, first, [n, 1])], None, (m, cols))

    def _qmatmul_dequantized(self, x, lx, dtype, w, n, k, m):
        # Weights dequantised to f32 on upload: x (m, k) . w^T with w (n, k).
        xd = x if dtype is f32 else self.cast(x, lx, dtype, f32)
        lxd = lx if dtype is f32 else Layout(lx.shape)
        xs, xoff = self._contiguous(xd, lxd, f32)
        y = self.matmul(xs, Layout((m, k), None, xoff), w, Layout((k, n), (1, k)), f32)
        return y if dtype is f32 else self.cast(y, Layout((m * n,)), f32, dtype)

    def _run_quant(self, kernel, types, storages, words, groups, extra, label):
        key = ("q", kernel, tuple((k, v.name) for k, v in types.items()), extra)
        pipe = self._pipelines.get(key)
        if pipe is None:
            pipe = self.driver.pipeline(wgsl.build(kernel, types, self.has_f16, None, extra), label)
            self._pipelines[key] = pipe
        binds = [s if isinstance(s, tuple) else self._bind(s, label) for s in storages]
        grid = groups if isinstance(groups, tuple) else self._grid(groups, label)
        self._launch(pipe, binds, _pack(words), grid, storages)

    def dequantize(self, w, wdtype, numel, dtype):
        if w.dequantized:
            if dtype is not f32:
                return self.cast(w, Layout((numel,)), f32, dtype)
            return self.copy(w, Layout((numel,)), f32)
        return self._dequant_rows(w, wdtype, None, 1, numel, 1, dtype)

    def _dequant_rows(self, w, wdtype, ids, rows, per_row, src_rows, dtype, ids_dtype=i32):
        extra = self._quant_kernel(wdtype, "dequantize")
        if per_row % 32:
            raise ShapeError(f"wgpu dequantize {wdtype.name}: rows of {per_row} elements are not whole blocks")
        out = self._new(rows * per_row, dtype)
        if rows * per_row == 0:
            return out
        row_bytes = wdtype.nbytes(per_row)
        threads = rows * per_row // 32
        # A table larger than one binding (an embedding) is bound in pieces of source rows;
        # each dispatch writes the output rows whose ids fall in its piece.
        pieces = [(0, src_rows)] if ids is None else split.row_pieces(
            src_rows, row_bytes, self.limits["max_storage_binding"], self.limits["storage_align"],
            f"embedding lookup {wdtype.name}")
        for r0, r1 in pieces:
            wb = w if len(pieces) == 1 else self._bind_range(w, r0 * row_bytes, (r1 - r0) * row_bytes)
            words = [rows, per_row, row_bytes, 0 if ids is None else 1, src_rows, r0, r1 - r0]
            self._run_quant("dequant", {"Y": dtype, "I": ids_dtype}, [wb, w if ids is None else ids, out], words,
                            (threads + 63) // 64, extra, f"dequantize {wdtype.name}")
        return out

    # ---- indexing -------------------------------------------------------------------------
    def _quantized_rows(self, storage, layout, dtype, ids, lids, dim):
        rows, k = layout.shape
        if storage.dequantized:  # a format without in-kernel decoding: dequantised on upload
            return self.index_select(storage, Layout((rows, k)), f32, ids, lids, dim)
        count = lids.numel()
        if not lids.is_contiguous() or lids.offset:
            ids, lids = self.copy(ids, lids, self._ids_dtype), Layout((count,))
        return self._dequant_rows(storage, dtype, ids, count, k, rows, f32, self._ids_dtype)

    def _index_select_kernel(self, storage, layout, dtype, ids, lids, dim, shape, out):
        ids_strides = [0] * len(shape)
        ids_strides[dim] = lids.strides[0] if lids.shape else 0
        self._ew("index", "index_select", {"X": dtype, "I": self._ids_dtype},
                 [(storage, layout.offset, layout.strides), (ids, lids.offset, ids_strides)], out, shape,
                 [dim, layout.shape[dim]], coalesce=False)

    # The contract passes index tensors without their dtype; integer ids are
    # i32 on the GPU for every signed dtype (i64/i32/i8) and u32 for unsigned
    # ones, and ids are never negative beyond -len, so reading as i32 is right
    # for both.
    _ids_dtype = i32

    def _gather_kernel(self, storage, layout, dtype, ids, lids, dim, out):
        self._ew("index", "gather", {"X": dtype, "I": self._ids_dtype},
                 [(storage, layout.offset, layout.strides), (ids, lids.offset, lids.strides)], out, lids.shape,
                 [dim, layout.shape[dim]], coalesce=False)

    def scatter_add(self, dst, ld, dtype, ids, lids, src, ls, dim):
        out = self._new(ld.numel(), dtype)
        ids_shape = list(lids.shape) + [0] * (MAX_DIMS - len(lids.shape))
        self._ew("scatter_add", "scatter_add", {"X": dtype, "I": self._ids_dtype},
                 [(dst, ld.offset, ld.strides), (ids, lids.offset, lids.strides), (src, ls.offset, ls.strides)],
                 out, ld.shape, [dim] + ids_shape, coalesce=False)
        return out

    # ---- convolution ------------------------------------------------------------------------
    @staticmethod
    def _conv_words(numel, g):
        """conv.wgsl's and im2col.wgsl's words: the elements they write, then the geometry."""
        return [numel, g.b, g.cin, g.h, g.w, g.cout, g.cin_g, g.kh, g.kw, g.oh, g.ow, g.stride_h, g.stride_w,
                g.pad_h, g.pad_w, g.dilation_h, g.dilation_w, g.cout // g.groups]

    def _im2col_fits(self, col_numel, dtype):
        return col_numel * self._esize(dtype) <= self.limits["max_storage_binding"]

    def _im2col_kernel(self, xs, cols, col_numel, g, dtype):
        self._run("im2col", {"X": dtype}, [xs, cols], self._conv_words(col_numel, g), (col_numel + 255) // 256,
                  label="im2col")

    def _direct_conv_kernel(self, xs, ws, out, numel, g, dtype):
        """The unfolded input would not fit one binding: a direct convolution."""
        self._run("conv", {"X": dtype}, [xs, ws, out], self._conv_words(numel, g), (numel + 255) // 256, label="conv")

    # ---- fused ----------------------------------------------------------------------------------
    def _softmax_kernel(self, storage, layout, out, log, dtype, scale=1.0, mask=None, lmask=None, causal=False):
        """kernels/softmax.wgsl, one workgroup per row, strided; scale, mask and the causal limit
        fused in for the unfused attention."""
        numel = layout.numel()
        d = layout.shape[-1] if layout.shape else 1
        rows = numel // d
        tq = layout.shape[-2] if len(layout.shape) >= 2 else 1
        ops = [(storage, layout.offset, layout.strides)]
        ops.append((mask, lmask.offset, lmask.strides) if mask is not None else (storage, 0, [0] * len(layout.shape)))
        words = _layout_words(layout.shape or (1,), [(o, s or [0]) for _, o, s in ops], True, "softmax")
        extras = [d, f32_bits(scale), int(mask is not None), int(causal), d - tq, int(log), tq, rows]
        self._run("softmax", {"X": dtype}, [s for s, _, _ in ops] + [out], self._params(words, extras), rows,
                  label="softmax")

    def _norm_kernel(self, x, lx, w, lw, b, lb, out, dtype, eps, center):
        """kernels/norm.wgsl, one workgroup per row; x, w and b strided (w and b broadcast)."""
        d = lx.shape[-1]
        rows = lx.numel() // d
        ops = [(x, lx.offset, lx.strides)]
        for st, lay in ((w, lw), (b, lb)):
            if st is None:
                ops.append((x, 0, [0] * len(lx.shape)))
            else:
                bl = lay.broadcast_to(lx.shape, "norm weight")
                ops.append((st, bl.offset, bl.strides))
        words = _layout_words(lx.shape, [(o, s) for _, o, s in ops], True, "norm")
        extras = [d, int(center), f32_bits(eps), int(w is not None), int(b is not None), rows]
        self._run("norm", {"X": dtype}, [s for s, _, _ in ops] + [out], self._params(words, extras), rows,
                  extra=("row_sum",), label="layer_norm" if center else "rms_norm")

    def _rope_kernel(self, x, lx, cos, lcos, sin, lsin, out, interleaved, dtype):
        *lead, d = lx.shape
        h = d // 2
        sd = lx.strides[-1]
        pair_shape = tuple(lead) + (h,)
        x_strides = list(lx.strides[:-1]) + [2 * sd if interleaved else sd]
        partner = sd if interleaved else h * sd
        lc = lcos.broadcast_to(pair_shape, "rope cos")
        ls = lsin.broadcast_to(pair_shape, "rope sin")
        words = _layout_words(pair_shape, [(lx.offset, x_strides), (lc.offset, lc.strides), (ls.offset, ls.strides)],
                              False, "rope")
        extras = [partner, int(interleaved), h]
        self._run("rope", {"X": dtype}, [x, cos, sin, out], self._params(words, extras), (words[0] + 255) // 256,
                  label="rope")

    def _attention_fits(self, lq, lk, lv):
        """attend.wgsl: a few query rows (longer prompts share loads in the matmuls), keys and
        values as rows of contiguous features read as vec4s."""
        return lq.shape[2] <= ATTEND_MAX_ROWS and self._attend_fits(lk, lv)

    @staticmethod
    def _attend_fits(lk, lv):
        return all(lay.shape[3] <= 256 and lay.shape[3] % 4 == 0 and lay.strides[3] == 1 and lay.offset % 4 == 0
                   and all(st % 4 == 0 for st in lay.strides[:3]) for lay in (lk, lv))

    def _attention_unfused(self, q, lq, k, lk, v, lv, mask, lmask, dtype, scale, causal):
        """Three dispatches: scores = q k^T (strided matmul, or matvec when decoding), a fused
        scale + mask + causal softmax, then p v."""
        *batch, tq, _ = lq.shape
        tk = lk.shape[-2]
        nd = len(lk.shape)
        kt = lk.permute(list(range(nd - 2)) + [nd - 1, nd - 2])
        scores = self.matmul(q, lq, k, kt, dtype)
        sl = Layout(tuple(batch) + (tq, tk))
        probs = self._new(sl.numel(), dtype)
        if sl.numel():
            self._softmax_kernel(scores, sl, probs, False, dtype, scale, mask, lmask, causal)
        return self.matmul(probs, sl, v, lv, dtype)

    def _attention_kernel(self, q, lq, k, lk, v, lv, mask, lmask, out, scale, causal, over_cache, dtype):
        """One dispatch: kernels/attend.wgsl, one workgroup per query row."""
        b, h, tq, d = lq.shape
        tk, dv = lk.shape[2], lv.shape[3]
        rows = b * h * tq
        words = [rows, h, tq, 0 if over_cache else tk, d, dv, f32_bits(scale), int(causal), int(mask is not None)]
        for lay in (lq, lk, lv, lmask if mask is not None else lq):
            words += [lay.offset, *lay.strides]
        prelude, binds = self._step_variant([q, k, v, mask if mask is not None else q, out], over_cache)
        self._run("attend", {"X": dtype}, binds, words, self._grid(rows, "attention"), label="attention",
                  prelude=prelude, extra=("workgroup_max_sum",))

    def cache_attention(self, q, lq, k, lk, v, lv, kc, lkc, vc, lvc, cos, lcos, sin, lsin, mask, lmask, dtype,
                        position, key_start, scale, interleaved):
        if lq.shape[2] != 1 or mask is not None or not self._attend_fits(lkc, lvc):
            return super().cache_attention(q, lq, k, lk, v, lv, kc, lkc, vc, lvc, cos, lcos, sin, lsin, mask, lmask,
                                           dtype, position, key_start, scale, interleaved)
        return self._cache_attend(q, lq, k, lk, v, lv, kc, lkc, vc, lvc, cos, lcos, sin, lsin, dtype, position,
                                  key_start, scale, interleaved)

    def _cache_attend(self, q, lq, k, lk, v, lv, kc, lkc, vc, lvc, cos, lcos, sin, lsin, dtype, position,
                      key_start, scale, interleaved):
        """One-token decode: kernels/cache_attend.wgsl rotates, appends and attends in one dispatch;
        over a long cache its splits' partial results take a second (kernels/attend_combine.wgsl)."""
        b, h, _, d = lq.shape
        hk, capacity, dv = lk.shape[1], lkc.shape[2], lv.shape[3]
        rows = b * h
        out = self._new(rows * dv, dtype)
        if rows * dv == 0:
            return out
        cap = self._capture()
        # While capturing (over the whole cache), the position comes from the step buffer: the
        # parameters hold 0 and the rotary rows relative to it, so one launch serves every step.
        # (A window's first key moves with the position: such a step records it as it is, and
        # tallow.capture's same_launches check then finds the step not replayable.)
        from_step = cap is not None and key_start == 0 and position == cap.position
        pos = cap.position if from_step else 0
        avail = capacity - key_start
        splits = 1 if avail < SPLIT_K_MIN_KEYS else min(MAX_SPLITS, -(-avail // KEYS_PER_SPLIT))
        per_split = -(-avail // splits)
        words = [rows, h, h // hk, d, dv, f32_bits(scale), position - pos, key_start, int(cos is not None),
                 int(interleaved), splits, per_split]
        for lay in (lq, lk, lv, lkc, lvc):
            words += [lay.offset, *lay.strides]
        for lay in (lcos, lsin):
            words += [0, 0, 0] if lay is None else [lay.offset - pos * lay.strides[0], *lay.strides]
        dest = out if splits == 1 else self._new(rows * splits * (dv + 2), f32)
        tables = [cos, sin] if cos is not None else [q, q]
        prelude, binds = self._step_variant([q, k, v, *tables, kc, vc, dest], from_step)
        self._run("cache_attend", {"X": dtype, "Y": dtype if splits == 1 else f32}, binds, words,
                  self._grid(rows * splits, "cache_attention"), label="cache_attention", prelude=prelude,
                  extra=("workgroup_max_sum",))
        if splits > 1:
            self._run("attend_combine", {"X": dtype}, [dest, out], [rows, splits, dv], self._grid(rows, "attention"),
                      label="attention_combine")
        return out

    def _add_norm_kernel(self, x, lx, r, lr, w, lw, b, lb, total, out, dtype, eps, center):
        """kernels/add_norm.wgsl, one workgroup per row, reading x, r, w and b strided."""
        d = lx.shape[-1]
        rows = lx.numel() // d
        words = _layout_words(lx.shape, [(lx.offset, lx.strides), (lr.offset, lr.strides)], True, "add_norm")
        extras = [d, int(w is not None), f32_bits(eps), rows, int(center), int(b is not None)]
        for lay in (lw, lb):
            extras += [0, 0] if lay is None else [lay.offset, lay.strides[0]]
        label = "add_layer_norm" if center else "add_rms_norm"
        self._run("add_norm", {"X": dtype}, [x, r, w if w is not None else x, b if b is not None else x, total, out],
                  self._params(words, extras), rows, extra=("row_sum",), label=label)

    # The decode matvecs (GpuBackend plans matmul_bias, gated_matmul, gated_qmatmul).
    matvec_max_rows = 1  # matvec_rows.wgsl: one row of x times w^T
    qmatvec_max_rows = QMATVEC_MAX_ROWS
    activations = ex.FLOAT_UNARY

    def _fits_binding(self, st):
        return (st.nbytes + 3) // 4 * 4 <= self.limits["max_storage_binding"]

    def _matvec_fits(self, b, lb, k, dtype):
        """matvec_rows.wgsl: w's rows (b's columns) read as vec4s, from one binding."""
        b_off, (b_rs, b_cs) = lb.offset, lb.strides
        return b_rs == 1 and k % 4 == 0 and b_off % 4 == 0 and b_cs % 4 == 0 and self._fits_binding(b)

    def _reads_blocks(self, w, wdtype, rows, k):
        """The blocks are on the GPU (not dequantised on upload), in whole blocks per row, in one binding."""
        return (not w.dequantized and in_kernel_quant(wdtype) and k % 32 == 0
                and wdtype.nbytes(rows * k) <= self.limits["max_storage_binding"])

    def _matvec_kernel(self, a, la, b, lb, dtype, bias, lbias):
        (m, k), n = la.shape, lb.shape[1]
        words = [m, n, k, 1, la.offset, 0, la.strides[0], la.strides[1], lb.offset, 0, lb.strides[0], lb.strides[1]]
        out = self._new(n, dtype)
        self._matmul_dispatch(a, b, out, words, dtype, (bias, lbias.offset, lbias.strides[0]))
        return out

    def _gated_matvec_kernel(self, a, la, b, lb, dtype, act):
        k, n = la.shape[1], lb.shape[1] // 2
        out = self._new(n, dtype)
        words = [1, n, k, 1, la.offset, 0, la.strides[0], la.strides[1], lb.offset, 0, lb.strides[0], lb.strides[1]]
        self._run("matvec_rows_glu", {"X": dtype}, [b, a, out], words, ((n + 255) // 256, 1, 1),
                  {"ACT": ex.FLOAT_UNARY[act]}, ("input_strided",), label=f"gated matvec {act}", prelude=ex.MATH)
        return out

    def _gated_qmatvec_kernel(self, x, lx, dtype, w, wdtype, n, k, act):
        m = lx.numel() // k
        out = self._new(m * n, dtype)
        xs, xoff = self._contiguous(x, lx, dtype)
        self._run("qmatvec_glu", {"X": dtype}, [w, xs, out], _qmatvec_words(m, n, k, wdtype.nbytes(k), xoff),
                  self._grid((n + 255) // 256, "gated qmatvec"), {"ACT": ex.FLOAT_UNARY[act]},
                  ("quant_common", wdtype.name) + _QMATVEC_INPUT, f"gated qmatvec {wdtype.name} {act}", ex.MATH)
        return out

    def qmatmul_bias(self, x, lx, dtype, w, wdtype, n, k, bias, lbias):
        m = lx.numel() // k if k else 0
        if not (runs_matvec(m, self.qmatvec_max_rows, wdtype) and self._reads_blocks(w, wdtype, n, k)):
            return super().qmatmul_bias(x, lx, dtype, w, wdtype, n, k, bias, lbias)
        out = self._new(m * n, dtype)
        if m * n:
            xs, xoff = self._contiguous(x, lx, dtype)
            self._qmatmul_piece(w, xs, out, m, n, k, wdtype.nbytes(k), xoff, dtype, wdtype,
                                self._quant_kernel(wdtype, "quantised matmul"), (bias, lbias.offset, lbias.strides[0]))
        return out

    def add_norm_linear(self, x, lx, r, lr, nw, lnw, nb, lnb, w, lw, wdtype, bias, lbias, dtype, eps, center, act,
                        gated):
        """One row (decoding): one dispatch of the matvec kernel with norm_input.wgsl, each
        workgroup normalising the row itself. Otherwise the composed default."""
        k = lx.shape[-1]
        m = lx.numel() // k if k else 0
        rows = lw.shape[0]
        n = rows // 2 if gated else rows
        if wdtype.is_quantized:
            fits = self._reads_blocks(w, wdtype, rows, k)
        else:  # w (rows, k) read as b = w^T (k, rows)
            fits = self._matvec_fits(w, Layout((k, rows), lw.strides[::-1], lw.offset), k, dtype)
        if not (fits and m == 1 and n and 0 < k <= NORM_INPUT_MAX_K and (act is None or act in ex.FLOAT_UNARY)):
            return super().add_norm_linear(x, lx, r, lr, nw, lnw, nb, lnb, w, lw, wdtype, bias, lbias, dtype, eps,
                                           center, act, gated)
        xs, xoff = self._contiguous(x, lx, dtype)
        rs, roff = self._contiguous(r, lr, dtype) if r is not None else (xs, 0)
        # hidden is always bound (written only with a residual): a fresh buffer, as a writable
        # binding may not alias the read-only ones.
        total, out = self._new(k, dtype), self._new(n, dtype)
        norm_words = [int(r is not None), int(center), f32_bits(eps), int(nw is not None), int(nb is not None),
                      xoff, roff]
        for lay in (lnw, lnb):
            norm_words += [0, 0] if lay is None else [lay.offset, lay.strides[0]]
        norm = [rs, nw if nw is not None else xs, nb if nb is not None else xs, total]
        first = 4 if gated else 5  # the bindings after the kernel's own (the GLU kernels have no bias)
        subs = {"ACT": ex.FLOAT_UNARY[act] if act else "v", "K": str(k),
                **{f"NB{i}": str(first + i) for i in range(4)}}
        bias_st, bias_words = (xs, [0, 0, 0]) if bias is None else (bias, [1, lbias.offset, lbias.strides[0]])
        label = f"{'layer' if center else 'rms'}_norm {'gated ' if gated else ''}"
        if wdtype.is_quantized:
            words = _qmatvec_words(1, n, k, wdtype.nbytes(k), 0)
            kernel = "qmatvec_glu" if gated else "qmatvec"
            extra = ("quant_common", wdtype.name, "qmatvec_block")
            grid, label = self._grid((n + 255) // 256, "qmatvec"), label + f"qmatvec {wdtype.name}"
        else:
            words = [1, n, k, 1, 0, 0, 0, 1, lw.offset, 0, lw.strides[1], lw.strides[0]]
            kernel, extra = "matvec_rows_glu" if gated else "matvec_rows", ()
            grid, label = ((n + 255) // 256, 1, 1), label + "matvec"
        own = [w, xs, out] + ([] if gated else [bias_st])
        words = words + ([] if gated else bias_words)
        self._run(kernel, {"X": dtype}, own + norm, words + [0] * (48 - len(words)) + norm_words, grid, subs,
                  extra + ("row_sum", "norm_input"), label=label + (f" {act}" if act else ""),
                  prelude=ex.MATH if act else "")
        return (total if r is not None else None), out

    def _kv_write_kernel(self, k, v, kc, vc, words, nk, nv, dtype):
        prelude, binds = self._step_variant([k, v, kc, vc], self._capture() is not None)
        self._run("kv_write", {"X": dtype}, binds, [nk, nv] + words, (nk + nv + 255) // 256, label="kv_write",
                  prelude=prelude)

    def _rope_kv_write_kernel(self, q, k, v, cos, sin, kc, vc, out, words, pairs, dims, interleaved, dtype):
        prelude, binds = self._step_variant([q, k, v, cos, sin, kc, vc, out], self._capture() is not None)
        self._run("rope_kv", {"X": dtype}, binds, [pairs, *dims, int(interleaved)] + words, (pairs + 255) // 256,
                  label="rope_kv_write", prelude=prelude)

    # ---- user-defined ops (tallow.custom_op: GpuBackend.custom checks, this launches) -----
    def custom_source(self, op):
        return op.wgsl

    def _custom_launch(self, op, source, args, out, numel):
        """Binding 0 is the uniform {numel}, then the inputs, then the output; @workgroup_size(64)."""
        pipe = self.driver.pipeline(source, f"custom op {op.name}")
        self._launch(pipe, [self._bind(st, op.name) for st in args + [out]], _pack([numel]),
                     self._grid((numel + 63) // 64, op.name), args + [out])
