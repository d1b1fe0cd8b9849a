"""The pure-Python backend ("python"): the reference and the in-browser CPU fallback.

Storage is an `array.array` of the dtype's typecode (f16/bf16 in 'f' holding
values already rounded to their precision; bool in 'B' as 0/1); quantised
dtypes keep their raw GGUF blocks as `bytes`. Only the standard library is
used, so it runs unchanged in Pyodide. Results follow the numpy backend: floats
are computed in Python floats and rounded to the dtype once, integers wrap.
"""
import math
import sys
from array import array
from itertools import accumulate

from ..dtypes import bf16, bool_, f16, f32, i64
from ..errors import DTypeError, IndexRangeError, ShapeError, UnsupportedError
from ..layout import Layout, broadcast_shapes, contiguous_strides, inverse_permutation
from . import python_elementwise as ew
from . import python_fused as fused
from . import python_linalg as linalg
from .base import Backend
from .operand import Operand, parts
from .python_storage import (
    bf16_from_bytes, bf16_to_bytes, f16_from_bytes, f16_to_bytes, from_le_bytes, offsets, pack,
    read, read_list, to_ints, to_le_bytes,
)
from .specs import ConvSpec


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _checked_ids(values, size, op):
    """Indices with negatives counted from the end (the backend contract, as numpy; Tensor
    refuses negative ids before they get here); out of range is an error."""
    out = [i + size if i < 0 else i for i in values]
    for i, j in zip(values, out):
        if not 0 <= j < size:
            raise IndexRangeError(f"{op}: index {i} is out of range for a dim of size {size}")
    return out


def _has_nan(chunk):
    s = sum(chunk)
    return s != s and any(x != x for x in chunk)


class PythonBackend(Backend):
    name = "python"

    def features(self):
        return {
            "backend": "pure Python (array.array)",
            "python": sys.version.split()[0],
            "f16": True,
            "bf16": True,
            "fast_dot": hasattr(math, "sumprod"),
        }

    # ---- memory -----------------------------------------------------------------------
    def from_bytes(self, data, dtype):
        data = bytes(data)
        if dtype.is_quantized:
            return data
        self._check_whole_elements(len(data), dtype)
        if dtype is f16:
            return f16_from_bytes(data)
        if dtype is bf16:
            return bf16_from_bytes(data)
        arr = from_le_bytes(dtype.code, data)
        return pack(arr, bool_) if dtype is bool_ else arr

    def to_bytes(self, storage, layout, dtype):
        if dtype.is_quantized:
            if not layout.is_contiguous():
                raise UnsupportedError(f"the python backend cannot read a strided view of quantised {dtype.name} data")
            start = layout.offset // dtype.block_size * dtype.block_bytes
            return bytes(storage[start:start + dtype.nbytes(layout.numel())])
        values = read(storage, layout)
        if dtype is f16:
            return f16_to_bytes(values)
        if dtype is bf16:
            return bf16_to_bytes(values)
        return to_le_bytes(values)

    def from_list(self, values, dtype):
        return pack(values, dtype)

    def to_list(self, storage, layout, dtype):
        values = read(storage, layout).tolist()
        return list(map(bool, values)) if dtype is bool_ else values

    def full(self, numel, value, dtype):
        return pack([value], dtype) * numel

    def arange(self, start, step, numel, dtype):
        return pack([start + step * i for i in range(numel)], dtype)

    # ---- element-wise ---------------------------------------------------------------------
    def copy(self, storage, layout, dtype):
        if dtype.is_quantized:
            return self.to_bytes(storage, layout, dtype)
        return read(storage, layout)

    def assign(self, dst, ld, src, ls, dtype):
        values = read(src, ls)
        n = ld.numel()
        if n == 0:
            return
        if ld.is_contiguous():
            dst[ld.offset:ld.offset + n] = values
            return
        last, stride = ld.shape[-1], ld.strides[-1]
        rows = offsets(ld.offset, [[k * st for k in range(s)] for s, st in zip(ld.shape[:-1], ld.strides[:-1])])
        if stride > 0:
            span = (last - 1) * stride + 1
            for r, b in enumerate(rows):
                dst[b:b + span:stride] = values[r * last:(r + 1) * last]
        else:  # a broadcast (stride 0) destination: later elements win, as numpy
            for o, v in zip(offsets(ld.offset, [[k * st for k in range(s)] for s, st in zip(ld.shape, ld.strides)]),
                            values):
                dst[o] = v

    def cast(self, storage, layout, src_dtype, dst_dtype):
        values = read(storage, layout)
        if src_dtype is dst_dtype:
            return values
        if dst_dtype.is_int and src_dtype.is_float:
            return pack(to_ints(values, dst_dtype), dst_dtype)
        return pack(values, dst_dtype)

    def unary(self, op, storage, layout, dtype, arg=None):
        result = ew.unary(op, read(storage, layout), dtype, arg)
        return pack(result, bool_ if op == "logical_not" else dtype)

    def binary(self, op, a, la, b, lb, dtype):
        la, lb = self._same_shape(la, lb, op)
        return pack(ew.binary(op, read(a, la), read(b, lb), dtype), dtype)

    def compare(self, op, a, la, b, lb, dtype):
        la, lb = self._same_shape(la, lb, op)
        return pack(ew.compare(op, read(a, la), read(b, lb)), bool_)

    def where(self, cond, a, b, dtype):
        (cond, lc), (a, la), (b, lb) = cond, a, b
        if not (lc.shape == la.shape == lb.shape):
            shape = broadcast_shapes(broadcast_shapes(lc.shape, la.shape, "where"), lb.shape, "where")
            lc, la, lb = (lay.broadcast_to(shape, "where") for lay in (lc, la, lb))
        c = read(cond, lc)
        return pack([x if t else y for t, x, y in zip(c, read(a, la), read(b, lb))], dtype)

    @staticmethod
    def _same_shape(la, lb, op):
        if la.shape != lb.shape:
            shape = broadcast_shapes(la.shape, lb.shape, op)
            return la.broadcast_to(shape, op), lb.broadcast_to(shape, op)
        return la, lb

    # ---- reductions and scans --------------------------------------------------------------
    def reduce(self, op, storage, layout, dtype, dims):
        shape = layout.shape
        dims = tuple(sorted(d % len(shape) for d in dims)) if shape else ()
        keep = [d for d in range(len(shape)) if d not in dims]
        count = _numel([shape[d] for d in dims])
        n_out = _numel([shape[d] for d in keep])
        if op in ("max", "min", "argmax", "argmin"):
            if op in ("argmax", "argmin") and len(dims) != 1:
                raise ShapeError(f"{op} reduces exactly one dim, got dims {dims}")
            if count == 0:
                raise ShapeError(f"{op} over an empty dim of shape {shape}")
        if n_out == 0:
            return pack([], self._reduce_dtype(op, dtype))
        if count == 0:
            return pack([0 if op == "sum" else 1] * n_out, self._reduce_dtype(op, dtype))
        values = read_list(storage, layout.moved_last(dims)[1])
        chunks = linalg.split_rows(values, count)
        if op == "sum":
            result = list(map(sum, chunks))
        elif op == "prod":
            result = list(map(math.prod, chunks))
        elif op in ("max", "min"):
            pick = max if op == "max" else min
            result = list(map(pick, chunks))
            if dtype.is_float:  # NaN propagates, as numpy
                result = [math.nan if _has_nan(c) else r for r, c in zip(result, chunks)]
        elif op in ("argmax", "argmin"):
            pick = max if op == "argmax" else min
            result = []
            for c in chunks:
                if dtype.is_float and _has_nan(c):
                    result.append(next(i for i, x in enumerate(c) if x != x))  # first NaN wins
                else:
                    result.append(c.index(pick(c)))  # first occurrence
        else:
            raise DTypeError(f"unknown reduce op {op!r}")
        return pack(result, self._reduce_dtype(op, dtype))

    @staticmethod
    def _reduce_dtype(op, dtype):
        if op in ("argmax", "argmin"):
            return i64
        if op in ("sum", "prod") and dtype.kind in "iub":
            return i64
        return dtype

    def cumsum(self, storage, layout, dtype, dim):
        shape = layout.shape
        out_dtype = i64 if dtype.kind in "iub" else dtype
        if layout.numel() == 0:
            return pack([], out_dtype)
        nd = len(shape)
        dim %= nd
        perm, rows_last = layout.moved_last((dim,))
        out = []
        for row in linalg.split_rows(read_list(storage, rows_last), shape[dim]):
            out.extend(accumulate(row))
        result = pack(out, out_dtype)
        if dim == nd - 1:
            return result
        # Back from (others..., dim) order to the original row-major order.
        return read(result, Layout([shape[d] for d in perm]).permute(inverse_permutation(perm)))

    # ---- linear algebra and indexing ----------------------------------------------------------
    def matmul(self, a, b, dtype):
        (a, la), (b, lb) = a, b
        if len(la.shape) < 2 or len(lb.shape) < 2 or la.shape[-1] != lb.shape[-2]:
            raise ShapeError(f"matmul: shapes {la.shape} and {lb.shape} do not fit")
        if la.shape[:-2] != lb.shape[:-2]:  # batch dims broadcast, as numpy
            batch = broadcast_shapes(la.shape[:-2], lb.shape[:-2], "matmul")
            la = la.broadcast_to(batch + la.shape[-2:], "matmul")
            lb = lb.broadcast_to(batch + lb.shape[-2:], "matmul")
        return pack(linalg.matmul(a, la, b, lb), dtype)

    def qmatmul(self, x, w, dtype):
        from ..quant import qmatmul_python
        out = qmatmul_python(read_list(*x), *w)
        return out if dtype is f32 else pack(out, dtype)

    def dequantize(self, w, wdtype, numel, dtype):
        from ..quant import dequantize_python
        out = dequantize_python(w, wdtype, numel)
        return out if dtype is f32 else pack(out, dtype)

    def index_select(self, x, ids, dtype, dim):
        (storage, layout), (ids, lids) = x, ids
        size = layout.shape[dim]
        picked = _checked_ids(read_list(ids, lids), size, "index_select")
        if dtype.is_quantized:
            if dim != 0 or len(layout.shape) != 2:
                raise UnsupportedError(f"index_select of quantised {dtype.name} data picks rows (dim 0) of a matrix")
            from ..quant import dequantize_rows_python
            return dequantize_rows_python(self.to_bytes(storage, layout, dtype), dtype, layout.shape[1], picked)
        steps = [[k * st for k in range(s)] for s, st in zip(layout.shape, layout.strides)]
        stride = layout.strides[dim]
        steps[dim] = [i * stride for i in picked]
        if dim == len(layout.shape) - 1 or not steps[-1]:
            return array(storage.typecode, map(storage.__getitem__, offsets(layout.offset, steps)))
        # Whole rows along the last dim: one slice per row.
        last, lstride = layout.shape[-1], layout.strides[-1]
        out = array(storage.typecode)
        for base in offsets(layout.offset, steps[:-1]):
            if lstride == 0:
                out.extend(storage[base:base + 1] * last)
            else:
                out.extend(storage[base:base + (last - 1) * lstride + 1:lstride])
        return out

    def gather(self, x, ids, dtype, dim):
        (storage, layout), (ids, lids) = x, ids
        shape = lids.shape
        if len(shape) != len(layout.shape) or any(
                s > t for d, (s, t) in enumerate(zip(shape, layout.shape)) if d != dim):
            raise ShapeError(f"gather: index shape {shape} does not fit source shape {layout.shape} along dim {dim}")
        picked = _checked_ids(read_list(ids, lids), layout.shape[dim], "gather")
        steps = [[k * st for k in range(s)] if d != dim else [0] * s
                 for d, (s, st) in enumerate(zip(shape, layout.strides))]
        stride = layout.strides[dim]
        get = storage.__getitem__
        return array(storage.typecode, [get(b + i * stride) for b, i in zip(offsets(layout.offset, steps), picked)])

    def scatter_add(self, dst, ids, src, dtype, dim):
        (dst, ld), (ids, lids), (src, ls) = dst, ids, src
        shape = lids.shape
        if ls.shape != shape or len(shape) != len(ld.shape) or any(
                s > t for d, (s, t) in enumerate(zip(shape, ld.shape)) if d != dim):
            raise ShapeError(f"scatter_add: index {shape}, source {ls.shape} and destination {ld.shape} "
                             f"do not fit along dim {dim}")
        out = read_list(dst, ld)
        cstrides = contiguous_strides(ld.shape)
        picked = _checked_ids(read_list(ids, lids), ld.shape[dim], "scatter_add")
        steps = [[k * st for k in range(s)] if d != dim else [0] * s
                 for d, (s, st) in enumerate(zip(shape, cstrides))]
        stride = cstrides[dim]
        for base, i, v in zip(offsets(0, steps), picked, read(src, ls)):
            out[base + i * stride] += v
        return pack(out, dtype)

    def conv1d(self, x, w, dtype, spec):
        lx2, lw2, s, p, d = linalg.conv1d_as_2d(x.layout, w.layout, spec.stride, spec.padding, spec.dilation)
        return self.conv2d(Operand(x.storage, lx2), Operand(w.storage, lw2), dtype, ConvSpec(s, p, d, spec.groups))

    def conv2d(self, x, w, dtype, spec):
        (x, lx), (w, lw) = x, w
        stride, padding, dilation, groups = spec.stride, spec.padding, spec.dilation, spec.groups
        if lx.shape[1] != lw.shape[1] * groups or lw.shape[0] % groups:
            raise ShapeError(f"conv: input {lx.shape} and weight {lw.shape} do not fit with groups={groups}")
        return pack(linalg.conv2d(x, lx, w, lw, stride, padding, dilation, groups), dtype)

    # ---- fused ---------------------------------------------------------------------------------
    def softmax(self, storage, layout, dtype, log=False):
        return pack(fused.softmax(storage, layout, log), dtype)

    def layer_norm(self, x, w, b, dtype, eps):
        return pack(fused.layer_norm(*x, *parts(w), *parts(b), eps), dtype)

    def rms_norm(self, x, w, dtype, eps):
        return pack(fused.rms_norm(*x, *parts(w), eps), dtype)

    def rope(self, x, rotary, dtype):
        return pack(fused.rope(*x, *rotary.cos, *rotary.sin, rotary.interleaved), dtype)

    def attention(self, q, k, v, mask, dtype, spec):
        return pack(fused.attention(*q, *k, *v, *parts(mask), spec.scale, spec.causal), dtype)

    def custom(self, op, inputs, out_shape, out_dtype):
        from ..layout import numel_of
        args = [(self.to_list(st, lay, dt), lay.shape) for st, lay, dt in inputs]
        try:
            flat = op.python(*args)
        except NotImplementedError:
            raise UnsupportedError(f"custom op {op.name!r} has no python() implementation "
                                   f"for the pure-Python backend") from None
        flat = list(flat)
        if len(flat) != numel_of(out_shape):
            raise ShapeError(f"custom op {op.name!r}: python() returned {len(flat)} values "
                             f"for output shape {tuple(out_shape)}")
        return self.from_list(flat, out_dtype)
