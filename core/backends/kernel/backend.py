"""KernelBackend: the CUDA C / MSL kernel table on the one GPU backend core
(tallow/backends/gpu_backend.py: buffer pool, launch recording, capture rules), over a kernel
*driver* (the protocol's kernel form, tallow/backends/driver_protocol.py). It decides what to
launch and packs each kernel's ordered arguments; the CUDA (CuPy) and Metal (PyObjC) drivers
and their CPU emulators only move bytes and launch. The backend subclass provides matmul and
custom_source(op). Storage is a DeviceStorage.
"""
import struct

from tallow.dtypes import bool_, f16, f32, f64, i32, i64
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout, contiguous_strides, inverse_permutation, numel_of

from .host import (BINARY_CODES, BLOCK, COMPARE_CODES, F64, I32, I64, REDUCE_CODES,
                   SCATTER_WORK_DTYPES, U32, U64, UNARY_CODES, Meta, f16_bits, grid_1d, grid_qmatvec,
                   kernel_name, pack_meta, pack_values, rows_of, scalar_bits, staging_dtype, unpack_values,
                   width_kernel, GATED_MATVEC_DTYPES)
from ..driver_protocol import nbytes_of
from ..gpu_backend import GpuBackend
from ..gpu_plan import in_kernel_quant, runs_matvec
from ..operand import Operand, parts
from ..step_buffer import STEP_BYTES
from .recording import entry_signature

QMATVEC_MAX_ROWS = 8  # above this many rows of x, dequantise once and use the dense matmul (gpu_plan.runs_matvec)
ATTENTION_MAX_HEAD_DIM = 256  # kernels keep q and the output row in shared memory
ATTENTION_ROWS, ATTENTION_ROWS_HEAD_DIM = 8, 128  # the decode kernel's query rows and head dims (attention.kernels)


class DeviceStorage:
    """One tensor's device memory: `buf` (a cupy array, an MTLBuffer, an emulator's byte array),
    its dtype and element count (for block dtypes, the byte count)."""
    __slots__ = ("buf", "dtype", "numel")

    def __init__(self, buf, dtype, numel):
        self.buf, self.dtype, self.numel = buf, dtype, numel

    @property
    def nbytes(self):
        return self.numel if self.dtype.is_quantized else self.numel * self.dtype.itemsize

    def __repr__(self):
        return f"DeviceStorage({self.dtype.name}, {self.numel})"


class PooledStorage(DeviceStorage):
    """A DeviceStorage over a buffer of the backend's pool (`held`, cap bytes, maybe larger than
    the tensor), given back when the storage dies. By __del__, not a weakref.finalize: a
    finalizer costs 2-3 us a tensor, which eager decoding pays hundreds of times a token, and the
    kernel drivers' buffers (MTLBuffers, the emulators' arrays) release nothing in a finalizer
    of their own that a give-back during garbage collection could race (wgpu's buffers do:
    its backend keeps weakref.finalize)."""
    __slots__ = ("_pool", "_held", "_cap")

    def __init__(self, buf, dtype, numel, pool, held, cap):
        self.buf, self.dtype, self.numel = buf, dtype, numel
        self._pool, self._held, self._cap = pool, held, cap

    def __del__(self):
        self._pool.release(self._held, self._cap, self.dtype)


class KernelBackend(GpuBackend):
    name = "kernel"

    def __init__(self, driver):
        super().__init__(driver)
        self._zero_step = None  # the step buffer eager launches of step kernels read: all zeros

    # ---- memory and launching (the pool and the recording are GpuBackend's) -----------------
    def _new(self, numel, dtype):
        if not self.pool.max_cached:
            return self.driver.alloc(dtype, numel)
        held, cap = self.pool.acquire(nbytes_of(dtype, numel), dtype)
        return PooledStorage(held.buf, dtype, numel, self.pool, held, cap)

    def _launch(self, module, kernel, grid, block, args):
        """grid and block are tuples, args a list the caller made for this launch alone."""
        self._submit(("launch", module, kernel, grid, block, args))

    def _host_call(self, fn, signature):
        """Run a host-side op that writes into storages it was given (cuBLAS, numpy on the
        emulators); recorded while capturing, so a replay runs it again. signature: what a
        recording compares it by (shapes, strides, dtype)."""
        self._submit(("call", fn, signature))

    def _issue(self, entry):
        if entry[0] == "launch":
            self.driver.launch(*entry[1:])
        else:
            entry[1]()

    def _step_buffer(self):
        """The step buffer the position-dependent kernels read: the capture's, else zeros."""
        cap = self._capture()
        if cap is not None:
            return cap.step
        if self._zero_step is None:
            self._zero_step = self.driver.upload(bytes(STEP_BYTES), i32)
        return self._zero_step

    # ---- capture and replay (tallow.capture): StepCapture, with these two pieces ------
    entry_signature = staticmethod(entry_signature)

    def _new_step_buffer(self, words):
        return self.driver.upload(words, i32)

    def overwrite(self, storage, data, dtype):
        data = bytes(data)
        if len(data) > storage.nbytes:
            raise ShapeError(f"{self.name} overwrite: {len(data)} bytes do not fit a {storage.nbytes}-byte storage")
        self.driver.write(storage, 0, data)

    # ---- helpers ------------------------------------------------------------------
    def _check(self, dtype, op):
        if dtype is f64 and not self.driver.has_f64:
            raise UnsupportedError(f"the {self.name} backend has no f64 ({op}); convert to f32 first")

    def _run(self, module, kernel, n, args):
        """A 1-D launch over n elements (the kernels loop over a capped grid)."""
        blocks = grid_1d(n)
        if blocks:
            self._launch(module, kernel, (blocks, 1, 1), (BLOCK, 1, 1), args)

    def _as(self, st, layout, src, dst):
        """Contiguous storage of the layout's elements in dtype dst."""
        return self._packed(st, layout, src) if src is dst else self.cast(st, layout, src, dst)

    def _ids64(self, ids, lids):
        return self._as(ids, lids, ids.dtype, i64)

    # ---- memory -------------------------------------------------------------------
    def from_bytes(self, data, dtype):
        self._check(dtype, "from_bytes")
        self._check_whole_elements(memoryview(data).nbytes, dtype)
        return self.driver.upload(data, dtype)

    def to_bytes(self, st, layout, dtype):
        if dtype.is_quantized:
            return self.driver.download(st, 0, st.nbytes)
        n = layout.numel()
        if layout.is_contiguous():
            return self.driver.download(st, layout.offset * dtype.itemsize, n * dtype.itemsize)
        return self.driver.download(self.copy(st, layout, dtype), 0, n * dtype.itemsize)

    def from_list(self, values, dtype):
        self._check(dtype, "from_list")
        if dtype is f16:  # rounded once, from the Python float (a device cast from f64 or f32 rounds twice)
            return self.driver.upload(struct.pack(f"<{len(values)}H", *[f16_bits(v) for v in values]), f16)
        stage = staging_dtype(dtype)
        if stage is f64 and not self.driver.has_f64:
            stage = f32
        st = self.driver.upload(pack_values(values, stage), stage)
        return st if stage is dtype else self.cast(st, Layout((len(values),)), stage, dtype)

    def to_list(self, st, layout, dtype):
        return unpack_values(self.to_bytes(st, layout, dtype), dtype)

    def full(self, numel, value, dtype):
        self._check(dtype, "full")
        out = self._new(numel, dtype)
        self._run("elementwise", width_kernel("fill", dtype), numel, [out, U64(scalar_bits(value, dtype)), I64(numel)])
        return out

    # ---- element-wise ---------------------------------------------------------------
    def copy(self, st, layout, dtype):
        if dtype.is_quantized:  # blocks are copied whole, byte by byte
            out = self._new(st.nbytes, dtype)
            self._run("elementwise", "copy_w1", st.nbytes,
                      [st, out, pack_meta((st.nbytes,), [(0, (1,))]), I64(st.nbytes)])
            return out
        n = layout.numel()
        out = self._new(n, dtype)
        self._run("elementwise", width_kernel("copy", dtype), n,
                  [st, out, pack_meta(layout.shape, [layout], "copy"), I64(n)])
        return out

    def assign(self, dst, ld, src, ls, dtype):
        n = ld.numel()
        self._run("elementwise", width_kernel("assign", dtype), n,
                  [dst, src, pack_meta(ld.shape, [ld, ls], "assign"), I64(n)])

    def cast(self, st, layout, src_dtype, dst_dtype):
        self._check(src_dtype, "cast")
        self._check(dst_dtype, "cast")
        if src_dtype is dst_dtype:
            return self.copy(st, layout, src_dtype)
        n = layout.numel()
        out = self._new(n, dst_dtype)
        kernel = f"cast_{src_dtype.name}_{dst_dtype.name}"
        self._run("elementwise", kernel, n, [st, out, pack_meta(layout.shape, [layout], "cast"), I64(n)])
        return out

    def unary(self, op, st, layout, dtype, arg=None):
        self._check(dtype, op)
        if op == "logical_not":  # x == 0, against a broadcast zero
            zero = self.full(1, 0, dtype)
            return self.compare("eq", st, layout, zero, Layout(layout.shape, (0,) * len(layout.shape)), dtype)
        if op not in UNARY_CODES:
            self._missing(f"unary {op}")
        a0 = a1 = 0.0
        if op == "clamp":
            lo, hi = arg
            a0 = float("-inf") if lo is None else float(lo)
            a1 = float("inf") if hi is None else float(hi)
        elif op == "pow_scalar":
            a0 = float(arg)
        elif op == "affine":
            a0, a1 = float(arg[0]), float(arg[1])
        n = layout.numel()
        out = self._new(n, dtype)
        self._run("elementwise", kernel_name("unary", dtype), n,
                  [st, out, pack_meta(layout.shape, [layout], op), I64(n), I32(UNARY_CODES[op]), F64(a0), F64(a1)])
        return out

    def binary(self, op, a, la, b, lb, dtype):
        self._check(dtype, op)
        n = la.numel()
        out = self._new(n, dtype)
        self._run("elementwise", kernel_name("binary", dtype), n,
                  [a, b, out, pack_meta(la.shape, [la, lb], op), I64(n), I32(BINARY_CODES[op])])
        return out

    def compare(self, op, a, la, b, lb, dtype):
        self._check(dtype, op)
        n = la.numel()
        out = self._new(n, bool_)
        self._run("elementwise", kernel_name("compare", dtype), n,
                  [a, b, out, pack_meta(la.shape, [la, lb], op), I64(n), I32(COMPARE_CODES[op])])
        return out

    def where(self, cond, a, b, dtype):
        (cond, lc), (a, la), (b, lb) = cond, a, b
        self._check(dtype, "where")
        if cond.dtype is not bool_:
            cond, lc = self.cast(cond, lc, cond.dtype, bool_), Layout(lc.shape)
        n = la.numel()
        out = self._new(n, dtype)
        self._run("elementwise", kernel_name("where", dtype), n,
                  [cond, a, b, out, pack_meta(la.shape, [lc, la, lb], "where"), I64(n)])
        return out

    # ---- reductions and scans ---------------------------------------------------------
    def _reduce_kernel(self, op, st, layout, dtype, dims, plan):
        out_dtype, rows, length, pl = plan
        x = self._packed(st, pl, dtype)
        grid, block = (rows, 1, 1), (BLOCK, 1, 1)
        if op in ("argmax", "argmin"):
            out = self._new(rows, i64)
            self._launch("reduce", kernel_name("argreduce", dtype), grid, block,
                         [x, out, I64(length), I32(op == "argmax")])
            return out
        if dtype.is_float:
            out = self._new(rows, dtype)
            self._launch("reduce", kernel_name("reduce", dtype), grid, block,
                         [x, out, I64(length), I32(REDUCE_CODES[op])])
            return out
        wide = self._new(rows, i64)  # integer reductions accumulate in i64
        self._launch("reduce", kernel_name("reduce", dtype), grid, block,
                     [x, wide, I64(length), I32(REDUCE_CODES[op])])
        return wide if out_dtype is i64 else self.cast(wide, Layout((rows,)), i64, out_dtype)

    def _cumsum_kernel(self, st, layout, dtype, dim, out_dtype):
        perm, pl = layout.moved_last((dim,))
        rows, length = rows_of(pl.shape, 1)
        n = rows * length
        x = self._packed(st, pl, dtype)
        scanned = self._new(n, out_dtype)
        self._run("reduce", kernel_name("cumsum", dtype), rows, [x, scanned, I64(rows), I64(length)])
        if perm == sorted(perm):
            return scanned
        back = Layout(pl.shape).permute(inverse_permutation(perm))  # the scan in the input's dim order
        return self.copy(scanned, back, out_dtype)

    # ---- linear algebra and indexing ---------------------------------------------------
    def _qmatvec_kernel(self, x, w, dtype, bias=None):
        (x, lx), (w, wdtype, n, k), (bias, lbias) = x, w, parts(bias)
        m = lx.numel() // k
        xf = self._as(x, lx, dtype, f32)
        bf = xf if bias is None else self._as(bias, lbias, dtype, f32)  # the kernel adds an f32 bias
        out = self._new(m * n, f32)  # the quantised kernels write f32
        grid, block = grid_qmatvec(n, m)
        self._launch("quant", f"qmatvec_{wdtype.name}", grid, block,
                     [w, xf, bf, out, I32(n), I32(k), I32(m), I32(bias is not None)])
        return out if dtype is f32 else self.cast(out, Layout((m * n,)), f32, dtype)

    def _qmatmul_kernel(self, x, w, dtype):
        """A prompt (many rows), or a format no kernel reads: dequantise once, then the dense matmul."""
        (x, lx), (w, wdtype, n, k) = x, w
        m = lx.numel() // k
        xf = self._as(x, lx, dtype, f32)
        wf = self.dequantize(w, wdtype, n * k, f32)
        out = self.matmul(Operand(xf, Layout((m, k))), Operand(wf, Layout((k, n), (1, k))), f32)
        return out if dtype is f32 else self.cast(out, Layout((m * n,)), f32, dtype)

    def dequantize(self, w, wdtype, numel, dtype):
        self._check(dtype, "dequantize")
        if in_kernel_quant(wdtype):
            out = self._new(numel, f32)
            # Rows of one block each: no row length beyond int32.
            self._run("quant", f"dequant_{wdtype.name}", numel, [w, w, out, I64(numel), I32(wdtype.block_size), I32(0)])
        else:
            out = self._host_dequantize(w, wdtype, numel, None, None)
        return out if dtype is f32 else self.cast(out, Layout((numel,)), f32, dtype)

    def _host_dequantize(self, w, wdtype, numel, k, ids):
        """Block formats without a kernel: dequantised by the host backend (slow, but exact)."""
        from tallow.backends.host import dequantize_on_host, dequantize_rows_on_host
        raw = self.driver.download(w, 0, w.nbytes)
        if ids is None:
            return self.driver.upload(dequantize_on_host(raw, wdtype, numel), f32)
        picked = self.driver.download(ids, 0, numel // k * 8)  # the numel // k row ids (i64)
        cap = self._capture()
        if cap is not None:  # rows picked on the host by ids the step computed: a replay would repeat them
            cap.computed_on_host(f"{wdtype.name} rows looked up on the host")
        return self.driver.upload(dequantize_rows_on_host(raw, wdtype, k, picked), f32)

    def _quantized_rows(self, st, layout, dtype, ids, lids, dim):
        ids64 = self._ids64(ids, lids)
        count, k = lids.numel(), layout.shape[1]
        if not in_kernel_quant(dtype):
            return self._host_dequantize(st, dtype, count * k, k, ids64)
        out = self._new(count * k, f32)
        self._run("quant", f"dequant_{dtype.name}", count * k, [st, ids64, out, I64(count * k), I32(k), I32(1)])
        return out

    def _index_select_kernel(self, st, layout, dtype, ids, lids, dim, shape, out):
        ids64 = self._ids64(ids, lids)
        strides = list(layout.strides)
        dim_stride, strides[dim] = strides[dim], 0
        n = numel_of(shape)
        inner = numel_of(shape[dim + 1:])
        meta = pack_meta(shape, [(layout.offset, strides)], "index_select")
        self._run("index", width_kernel("index_select", dtype), n,
                  [st, ids64, out, meta, I64(n), I64(inner), I64(lids.numel()), I64(dim_stride),
                   I64(layout.shape[dim])])

    def _gather_kernel(self, st, layout, dtype, ids, lids, dim, out):
        ids64 = self._ids64(ids, lids)
        strides = list(layout.strides)
        dim_stride, strides[dim] = strides[dim], 0
        n = lids.numel()
        meta = pack_meta(lids.shape, [(layout.offset, strides)], "gather")
        self._run("index", width_kernel("gather", dtype), n,
                  [st, ids64, out, meta, I64(n), I64(dim_stride), I64(layout.shape[dim])])

    def scatter_add(self, dst, ids, src, dtype, dim):
        (dst, ld), (ids, lids), (src, ls) = dst, ids, src
        work = SCATTER_WORK_DTYPES[dtype.name]
        if work is i64 and not self.driver.atomic64:
            raise UnsupportedError(f"the {self.name} backend cannot scatter_add {dtype.name} (no 64-bit atomics); "
                                   f"use i32 or f32")
        self._check(dtype, "scatter_add")
        out = self._as(dst, ld, dtype, work) if work is not dtype else self.copy(dst, ld, dtype)
        ids64 = self._ids64(ids, lids)
        values, lv = (src, ls) if work is dtype else (self.cast(src, ls, dtype, work), Layout(ls.shape))
        out_strides = list(contiguous_strides(ld.shape))
        dim_stride, out_strides[dim] = out_strides[dim], 0
        n = ls.numel()
        meta = pack_meta(ls.shape, [lv, (0, out_strides)], "scatter_add")
        self._run("index", f"scatter_add_{work.name}", n,
                  [out, ids64, values, meta, I64(n), I64(dim_stride), I64(ld.shape[dim])])
        return out if work is dtype else self.cast(out, Layout(ld.shape), work, dtype)

    def conv2d(self, x, w, dtype, spec):
        if not dtype.is_float:
            self._missing(f"conv on {dtype.name}")
        return super().conv2d(x, w, dtype, spec)

    def _im2col_kernel(self, xs, cols, n, g, dtype):
        self._run("index", kernel_name("im2col", dtype), n,
                  [xs, cols, I64(n), I32(g.cin), I32(g.h), I32(g.w), I32(g.kh), I32(g.kw), I32(g.oh), I32(g.ow),
                   I32(g.stride_h), I32(g.stride_w), I32(g.pad_h), I32(g.pad_w), I32(g.dilation_h),
                   I32(g.dilation_w)])

    # ---- fused ------------------------------------------------------------------------
    def _rows_kernel(self, family, x, layout, out, extra_inputs, scalars, dtype):
        """reduce's row kernels: one block per row of contiguous x (and contiguous extra inputs)."""
        rows, length = rows_of(layout.shape, 1)
        xs = self._packed(x, layout, dtype)
        inputs = [xs] + [xs if s is None else self._packed(s, ls, dtype) for s, ls in extra_inputs]
        self._launch("reduce", kernel_name(family, dtype), (rows, 1, 1), (BLOCK, 1, 1),
                     inputs + [out, I64(length)] + scalars)

    def _softmax_kernel(self, st, layout, out, log, dtype):
        self._rows_kernel("softmax", st, layout, out, [], [I32(bool(log))], dtype)

    def _norm_kernel(self, x, norm, out, dtype):
        (x, lx), (w, lw), (b, lb), eps, center = x, parts(norm.weight), parts(norm.bias), norm.eps, norm.center
        if center:
            self._rows_kernel("layer_norm", x, lx, out, [(w, lw), (b, lb)],
                              [F64(eps), I32(w is not None), I32(b is not None)], dtype)
        else:
            self._rows_kernel("rms_norm", x, lx, out, [(w, lw)], [F64(eps), I32(w is not None)], dtype)

    def _rope_kernel(self, x, rotary, out, dtype):
        (x, lx), ((cos, lcos), (sin, lsin), interleaved) = x, rotary
        b, h, t, d = lx.shape
        cs, sn = self._packed(cos, lcos, dtype), self._packed(sin, lsin, dtype)
        self._run("index", kernel_name("rope", dtype), lx.numel() // 2,
                  [x, cs, sn, out, pack_meta(lx.shape, [lx], "rope"), I64(b * h), I64(t), I64(d),
                   I32(bool(interleaved))])

    def _attention_fits(self, lq, lk, lv):
        return max(lq.shape[3], lv.shape[3]) <= ATTENTION_MAX_HEAD_DIM  # q and the output row in shared memory

    def _attention_unfused(self, q, k, v, mask, dtype, spec):
        d = max(q.layout.shape[3], v.layout.shape[3])
        raise UnsupportedError(f"{self.name} attention: head dim {d} > {ATTENTION_MAX_HEAD_DIM}")

    def _attention_kernel(self, qkv, mask, out, dtype, spec, over_cache):
        ((q, lq), (k, lk), (v, lv)), (mask, lmask), scale, causal = qkv, parts(mask), spec.scale, spec.causal
        b, h, tq, d = lq.shape
        tk, dv = lk.shape[2], lv.shape[3]
        lm = lmask if mask is not None else Layout((b, h, tq, tk), (0, 0, 0, 0))
        ameta = Meta([lq.offset, lk.offset, lv.offset, lm.offset, *lq.strides, *lk.strides, *lv.strides, *lm.strides])
        keys = I32(0 if over_cache else tk)
        if mask is None and tq <= ATTENTION_ROWS and max(d, dv) <= ATTENTION_ROWS_HEAD_DIM:
            # A decode step: one block per (batch, KV head) reads each key and value row once for
            # all its query rows (the grouped query heads the front end made rows).
            family = "attention_rows_step" if over_cache else "attention_rows"
            self._launch("attention", kernel_name(family, dtype), (b * h, 1, 1), (BLOCK, 1, 1),
                         [q, k, v, out, ameta, I32(h), I32(tq), keys, I32(d), I32(dv), F64(scale), I32(bool(causal)),
                          self._step_buffer()])
            return
        args = [q, k, v, mask if mask is not None else q, out, ameta, I32(h), I32(tq), keys,
                I32(d), I32(dv), F64(scale), I32(mask is not None), I32(bool(causal))]
        if over_cache:
            self._launch("attention", kernel_name("attention_step", dtype), (b * h * tq, 1, 1), (BLOCK, 1, 1),
                         args + [self._step_buffer()])
        else:
            self._launch("attention", kernel_name("attention", dtype), (b * h * tq, 1, 1), (BLOCK, 1, 1), args)

    # ---- fused decode ops: one launch each (base.py composes them from the primitives) ----
    def _add_norm_kernel(self, x, r, norm, total, out, dtype):
        """reduce's add_norm kernel, one block per row of contiguous x and r."""
        (x, lx), (r, lr), (w, lw), (b, lb) = x, r, parts(norm.weight), parts(norm.bias)
        eps, center = norm.eps, norm.center
        rows, length = rows_of(lx.shape, 1)
        xs, rs = self._packed(x, lx, dtype), self._packed(r, lr, dtype)
        ws = xs if w is None else self._packed(w, lw, dtype)
        bs = xs if b is None else self._packed(b, lb, dtype)
        self._launch("reduce", kernel_name("add_norm", dtype), (rows, 1, 1), (BLOCK, 1, 1),
                     [xs, rs, ws, bs, total, out, I64(length), F64(eps), I32(w is not None), I32(b is not None),
                      I32(center)])

    def _rope_kv_write_kernel(self, q, k, v, cos, sin, kc, vc, out, words, pairs, dims, interleaved, dtype):
        self._run("index", kernel_name("rope_kv_write", dtype), pairs,
                  [q, k, v, cos, sin, kc, vc, out, Meta(words), self._step_buffer(), *map(I64, dims),
                   I32(bool(interleaved))])

    def _kv_write_kernel(self, k, v, kc, vc, words, nk, nv, dtype):
        self._run("index", kernel_name("kv_write", dtype), nk + nv,
                  [k, v, kc, vc, Meta(words), self._step_buffer(), I64(nk), I64(nv)])

    # The decode matvecs (GpuBackend plans matmul_bias, gated_matmul, gated_qmatmul): one warp per
    # output column, up to QMATVEC_MAX_ROWS rows of x.
    matvec_max_rows = qmatvec_max_rows = QMATVEC_MAX_ROWS
    activations = UNARY_CODES
    # Of GpuBackend's optional fused ops, the biased quantised matvec is one launch here;
    # add_norm_linear composes (add_norm, then the matvec) and cache_attention composes
    # (rope_kv_write, then the decode attention kernel): two launches each.
    fused_kernels = frozenset({"qmatmul_bias"})

    def _matvec_fits(self, b, lb, k, dtype):
        # b k contiguous (a Linear's transposed weight): a warp's lanes read it together; f32 sums.
        return dtype in GATED_MATVEC_DTYPES and lb.strides[0] == 1

    def _rows_matvec(self, a, la, b, lb, dtype):
        """a (m, k) . b (k, n) for a few rows m (a decode step's projections) in one launch of the
        float matvec kernel; None where it does not apply (batched, many rows, other dtypes, b
        without k contiguous): the caller multiplies with its dense matmul."""
        if len(la.shape) != 2 or len(lb.shape) != 2:
            return None
        (m, k), n = la.shape, lb.shape[1]
        if not (m * n * k and runs_matvec(m, self.matvec_max_rows) and self._matvec_fits(b, lb, k, dtype)):
            return None
        return self._matvec_kernel(Operand(a, la), Operand(b, lb), dtype)

    def _matvec_kernel(self, a, b, dtype, bias=None):
        (a, la), (b, lb), (bias, lbias) = a, b, parts(bias)
        (m, k), n = la.shape, lb.shape[1]
        out = self._new(m * n, dtype)
        grid, block = grid_qmatvec(n, m)
        self._launch("quant", kernel_name("matvec", dtype), grid, block,
                     [self._packed(a, la, dtype), b, b if bias is None else bias, out, I64(lb.offset),
                      I64(lb.strides[0]), I64(lb.strides[1]), I64(0 if bias is None else lbias.offset),
                      I64(0 if bias is None else lbias.strides[0]), I32(n), I32(k), I32(m), I32(bias is not None)])
        return out

    def _gated_matvec_kernel(self, a, b, dtype, act):
        (a, la), (b, lb) = a, b
        (m, k), n = la.shape, lb.shape[1] // 2
        out = self._new(m * n, dtype)
        grid, block = grid_qmatvec(n, m)
        self._launch("quant", kernel_name("gated_matvec", dtype), grid, block,
                     [self._packed(a, la, dtype), b, out, I64(lb.offset), I64(lb.strides[0]), I64(lb.strides[1]),
                      I32(n), I32(k), I32(m), I32(UNARY_CODES[act])])
        return out

    def _gated_qmatvec_kernel(self, x, w, dtype, act):
        (x, lx), (w, wdtype, rows, k) = x, w
        n = rows // 2
        m = lx.numel() // k
        xf = self._as(x, lx, dtype, f32)
        out = self._new(m * n, f32)  # the quantised matvecs write f32
        grid, block = grid_qmatvec(n, m)
        self._launch("quant", f"gated_qmatvec_{wdtype.name}", grid, block,
                     [w, xf, out, I32(n), I32(k), I32(m), I32(UNARY_CODES[act])])
        return out if dtype is f32 else self.cast(out, Layout((m * n,)), f32, dtype)

    # ---- user-defined ops (tallow.custom_op: GpuBackend.custom checks, this launches) -----
    def _custom_launch(self, op, source, args, out, numel):
        """`main_kernel` of the op's source, compiled once: the inputs, the output and numel (U32),
        one thread per output element in blocks of BLOCK threads (the kernel checks i < numel)."""
        module = self.driver.load_source(op.name, source)
        self._launch(module, "main_kernel", ((numel + BLOCK - 1) // BLOCK, 1, 1), (BLOCK, 1, 1),
                     args + [out, U32(numel)])
