"""The wgpu backend's dense and quantised products: matvec (decoding), the many-row kernels
tuning.py chooses among, weights bound in pieces (split.py), and the fused decode matvecs."""

from tallow.backends.gpu_plan import f32_bits, in_kernel_quant, runs_matvec
from tallow.backends.operand import Operand, QuantWeight, parts
from tallow.dtypes import f32, i32, i64
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout, coalesce_dims, numel_of

from . import expressions as ex
from . import split, tuning, wgsl
from .common import _NO_ACT, _pack, _QMATVEC_INPUT, _qmatvec_words


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


class MatmulOps:
    """WgpuBackend's products (a mixin). matmul_with / qmatmul_with run one named kernel choice:
    the public callables tuning.py races."""

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

    def matmul(self, a, b, dtype):
        (a, la), (b, lb) = a, b
        if dtype is i64:
            return self._exact_i64("matmul", la.shape[:-1] + lb.shape[-1:],
                                   lambda host, up: host.matmul(Operand(*up(a, la, dtype)), Operand(*up(b, lb, dtype)),
                                                                dtype))
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
            self.matmul_with(choice, a_st, b_st, out, words, dtype)

    @staticmethod
    def _rows_vec4(words):
        """Whether a's rows and b's columns read as vec4s: x . w^T and q . k^T, aligned."""
        m, n, k, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs = words
        aligned = all(v % 4 == 0 for v in (a_off, a_bs, a_rs, b_off, b_bs, b_cs))
        return a_cs == 1 and b_rs == 1 and k % 4 == 0 and aligned

    def matmul_with(self, choice, a_st, b_st, out, words, dtype):
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

    def _qmatvec_kernel(self, x, w, dtype, bias=None):
        (x, lx), (w, wdtype, n, k), (bias, lbias) = x, w, parts(bias)
        m = lx.numel() // k
        out = self._new(m * n, dtype)
        xs, xoff = self._contiguous(x, lx, dtype)
        self._qmatmul_piece(w, xs, out, m, n, k, wdtype.nbytes(k), xoff, dtype, wdtype,
                            self._quant_kernel(wdtype, "quantised matmul"),
                            None if bias is None else (bias, lbias.offset, lbias.strides[0]))
        return out

    def _qmatmul_kernel(self, x, w, dtype):
        """Many rows (qmatmul.wgsl or the tiled kernel tuning.py picked), a weight bound in pieces
        (each piece's matvec or matmul into its columns), or blocks dequantised on upload."""
        (x, lx), (w, wdtype, n, k) = x, w
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
            self.qmatmul_with(choice, wb, xs, y, m, n, k, row_bytes, xoff, dtype, wdtype)

    def qmatmul_with(self, choice, wb, xs, y, m, n, k, row_bytes, xoff, dtype, wdtype):
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
        y = self.matmul(Operand(xs, Layout((m, k), None, xoff)), Operand(w, Layout((k, n), (1, k))), f32)
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

    # The decode matvecs (GpuBackend plans matmul_bias, gated_matmul, gated_qmatmul).
    matvec_max_rows = 1  # matvec_rows.wgsl: one row of x times w^T
    qmatvec_max_rows = QMATVEC_MAX_ROWS
    activations = ex.FLOAT_UNARY
    # GpuBackend's optional fused ops: all three have WGSL kernels (add_norm_linear: matvec_rows /
    # qmatvec with norm_input.wgsl; cache_attention: cache_attend.wgsl, in attention.py).
    fused_kernels = frozenset({"qmatmul_bias", "add_norm_linear", "cache_attention"})
    norm_linear_max_k = NORM_INPUT_MAX_K

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

    def _matvec_kernel(self, a, b, dtype, bias=None):
        (a, la), (b, lb), (bias, lbias) = a, b, parts(bias)
        (m, k), n = la.shape, lb.shape[1]
        words = [m, n, k, 1, la.offset, 0, la.strides[0], la.strides[1], lb.offset, 0, lb.strides[0], lb.strides[1]]
        out = self._new(n, dtype)
        self._matmul_dispatch(a, b, out, words, dtype, (bias, lbias.offset, lbias.strides[0]))
        return out

    def _gated_matvec_kernel(self, a, b, dtype, act):
        (a, la), (b, lb) = a, b
        k, n = la.shape[1], lb.shape[1] // 2
        out = self._new(n, dtype)
        words = [1, n, k, 1, la.offset, 0, la.strides[0], la.strides[1], lb.offset, 0, lb.strides[0], lb.strides[1]]
        self._run("matvec_rows_glu", {"X": dtype}, [b, a, out], words, ((n + 255) // 256, 1, 1),
                  {"ACT": ex.FLOAT_UNARY[act]}, ("input_strided",), label=f"gated matvec {act}", prelude=ex.MATH)
        return out

    def _gated_qmatvec_kernel(self, x, w, dtype, act):
        (x, lx), (w, wdtype, rows, k) = x, w
        n = rows // 2
        m = lx.numel() // k
        out = self._new(m * n, dtype)
        xs, xoff = self._contiguous(x, lx, dtype)
        self._run("qmatvec_glu", {"X": dtype}, [w, xs, out], _qmatvec_words(m, n, k, wdtype.nbytes(k), xoff),
                  self._grid((n + 255) // 256, "gated qmatvec"), {"ACT": ex.FLOAT_UNARY[act]},
                  ("quant_common", wdtype.name) + _QMATVEC_INPUT, f"gated qmatvec {wdtype.name} {act}", ex.MATH)
        return out

    def _norm_linear_kernel(self, x, r, norm, linear, dtype, n):
        """One dispatch of the matvec kernel with norm_input.wgsl, each workgroup normalising the row itself."""
        (x, lx), (r, lr), (nw, lnw), (nb, lnb) = x, parts(r), parts(norm.weight), parts(norm.bias)
        eps, center, w, act, gated = norm.eps, norm.center, linear.weight, linear.act, linear.gated
        (bias, lbias), quantised = parts(linear.bias), isinstance(w, QuantWeight)
        wdtype, lw, w = (w.dtype, None, w.storage) if quantised else (dtype, w.layout, w.storage)
        k = lx.shape[-1]
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
        if quantised:
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
