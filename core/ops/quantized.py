"""Quantised (GGUF block) tensors in the front end: dequantise, quantise, x @ w.T
and row lookups. A quantised tensor is used whole or transposed, never as a strided view."""
from .. import dtypes as D
from ..autograd import record_if_needed
from ..backends.operand import QuantWeight, operand_of
from ..errors import ShapeError, UnsupportedError
from ..layout import Layout


def base_quant(t, op):
    """The contiguous (rows, k) quantised tensor under this view."""
    lay = t._layout
    if lay.offset == 0 and lay.is_contiguous():
        return t
    if len(lay.shape) == 2 and lay.offset == 0 and lay.strides == (1, lay.shape[0]):
        return t._view(Layout((lay.shape[1], lay.shape[0])))
    raise UnsupportedError(f"{op}: a quantised tensor can be used whole or transposed, not as a strided view")


def dequantize(t, dtype):
    """The quantised t as a float tensor of dtype (same shape and view)."""
    w = base_quant(t, "to")
    st = t.device.backend.dequantize(w._storage, w.dtype, w.numel(), dtype)
    return t._new(st, w.shape, dtype)._view(t._layout)


def quantize(t, dtype):
    """A tensor of block dtype `dtype` (same shape and device) holding `t` quantised."""
    if not t.shape or t.shape[-1] % dtype.block_size:
        raise ShapeError(f"quantize to {dtype.name}: the last dim must be a multiple of {dtype.block_size}, "
                         f"got shape {tuple(t.shape)}")
    from ..quant.quantize_tensor import quantize_bytes  # tallow.quant loads on first use: `import tallow` stays light
    data = quantize_bytes(t.to(D.f32), dtype)
    return t._new(t.device.backend.from_bytes(data, dtype), t.shape, dtype)


def qmatmul(x, w_t):
    """x @ w.T with w quantised (n, k): the backend dequantises inside its kernel."""
    w = base_quant(w_t, "matmul")
    if w_t._layout.strides != (1, w.shape[1]):
        raise UnsupportedError("a quantised weight w (out, in) is used as x @ w.T "
                               "(or tallow.nn.functional.linear(x, w)); "
                               f"got it as the right operand with shape {w_t.shape} untransposed")
    n, k = w.shape
    if x.shape[-1] != k:
        raise ShapeError(f"matmul: shapes {x.shape} and {w_t.shape} do not fit ({x.shape[-1]} vs {k})")
    dtype = x.dtype if x.dtype.is_float else D.f32
    x = x.to(dtype)
    st = x.device.backend.qmatmul(operand_of(x), QuantWeight(w._storage, w.dtype, n, k), dtype)
    out = x._new(st, x.shape[:-1] + (n,), dtype)
    return record_if_needed(out, (x,), lambda: (lambda g: (g @ w.to(dtype),)))


def rows(t, index, shape):
    """index_select(0, index) of a quantised table: f32 rows, dequantised by the backend."""
    w = base_quant(t, "index_select")
    return t._new(t.device.backend.index_select(operand_of(w), operand_of(index), w.dtype, 0), shape, D.f32)
