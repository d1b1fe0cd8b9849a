"""The wgpu backend's element-wise ops and reductions: each op's WGSL expression
(expressions.py) built into the kernel text."""

from tallow.backends.gpu_plan import f32_bits
from tallow.dtypes import bool_, i64, u32
from tallow.errors import UnsupportedError
from tallow.layout import Layout

from . import expressions as ex
from . import wgsl
from .common import _contig_strides, _layout_words


class ElementwiseOps:
    """WgpuBackend's element-wise ops, reductions and cumsum (a mixin)."""

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

    def where(self, cond, a, b, dtype):
        (cond, lc), (a, la), (b, lb) = cond, a, b
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
