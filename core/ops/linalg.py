"""Matrix multiplication (batched, broadcast, 1-D operands as in numpy; a quantised
right operand goes to the backend's fused dequantising kernel)."""
from .. import dtypes as D
from .. import grad_rules as G
from ..autograd import needs_grad, record_if_needed
from ..backends.operand import Operand, QuantWeight, operand_of
from ..errors import ShapeError
from ..layout import broadcast_shapes
from ..tensor_base import TensorBase
from .arguments import same_device
from .elementwise import binary
from .quantized import qmatmul
from .shape import reshape, t


def linear(x, weight, bias=None):
    """x @ weight.T + bias, weight (n, k) float or quantised; with a bias, one backend call
    (matmul_bias / qmatmul_bias) instead of a matmul and an add."""
    if x.ndim == 0 or x.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"linear: input {x.shape} has {x.shape[-1] if x.ndim else 0} features, "
                         f"weight {weight.shape} expects {weight.shape[-1]}")
    if weight.dtype.is_quantized:  # as qmatmul: x's float dtype
        dtype = x.dtype if x.dtype.is_float else D.f32
        if (bias is None and weight.ndim == 2 and not weight._layout.offset and weight._layout.is_contiguous()
                and not needs_grad(x)):
            # qmatmul(x, t(weight)) without making the transposed view and taking it apart again
            # (a decoding step's o_proj and down_proj: 60 views per SmolLM2 token)
            same_device("linear", x, weight)
            x = x.to(dtype)
            st = x.device.backend.qmatmul(operand_of(x), QuantWeight(weight._storage, weight.dtype, *weight.shape),
                                          dtype)
            return x._new(st, x.shape[:-1] + (weight.shape[0],), dtype)
    else:
        dtype = D.promote(x.dtype, weight.dtype)
        if keeps_f16_weight(x, weight, dtype, bias):
            return _f16_weight_linear(x, weight, bias)
    if (bias is None or weight.ndim != 2 or bias.shape != (weight.shape[0],) or bias.dtype is not dtype
            or bias.device is not x.device or needs_grad(x, weight, bias)
            or (weight.dtype.is_quantized and (not weight._layout.is_contiguous() or weight._layout.offset))):
        y = matmul(x, t(weight))
        return y if bias is None else binary(y, bias, "add")
    n, k = weight.shape
    lead = x.shape[:-1]
    be = x.device.backend
    if weight.dtype.is_quantized:
        x = x.to(dtype)
        st = be.qmatmul_bias(operand_of(x), QuantWeight(weight._storage, weight.dtype, n, k), operand_of(bias), dtype)
        return x._new(st, lead + (n,), dtype)
    x2, wt = reshape(x.to(dtype), (-1, k)), t(weight.to(dtype))
    st = be.matmul_bias(operand_of(x2), operand_of(wt), operand_of(bias), dtype)
    return x._new(st, lead + (n,), dtype)


def keeps_f16_weight(x, weight, dtype, *others):
    """Whether x's device multiplies x (f32) by this 2-D f16 weight as it lies (the backend's
    f16_weight_products: the wasm device's gemm_f16), so the weight is held once, as f16, rather
    than cast to an f32 copy for the product; never where a gradient is wanted."""
    return (weight.dtype is D.f16 and dtype is D.f32 and weight.ndim == 2
            and getattr(x.device.backend, "f16_weight_products", False)
            and not needs_grad(x, weight, *[o for o in others if o is not None]))


def _f16_weight_linear(x, weight, bias):
    """linear for keeps_f16_weight: one matmul (matmul_bias with an f32 bias (n,)) whose right
    operand is the f16 weight's transposed view; the product is f32."""
    same_device("linear", x, weight)
    n, k = weight.shape
    be = x.device.backend
    x2 = reshape(x.to(D.f32), (-1, k))
    wt = operand_of(t(weight))
    if bias is not None and bias.shape == (n,) and bias.dtype is D.f32 and bias.device is x.device:
        st = be.matmul_bias(operand_of(x2), wt, operand_of(bias), D.f32)
        return x._new(st, x.shape[:-1] + (n,), D.f32)
    y = x._new(be.matmul(operand_of(x2), wt, D.f32), x.shape[:-1] + (n,), D.f32)
    return y if bias is None else binary(y, bias, "add")


def matmul(a, b):
    if not isinstance(b, TensorBase):
        return NotImplemented
    same_device("matmul", a, b)
    if b.dtype.is_quantized:
        return qmatmul(a, b)
    x, y = a, b
    if x.ndim == 0 or y.ndim == 0:
        raise ShapeError(f"matmul: both operands need at least 1 dim, got shapes {x.shape} and {y.shape}")
    if y.ndim == 2 and x.ndim > 2 and x.shape[-1] == y.shape[0]:
        # (..., k) @ (k, n): one 2-D matmul over the flattened rows (a broadcast weight
        # would otherwise send numpy down a slow batched path).
        return matmul(x.reshape(-1, x.shape[-1]), y).reshape(x.shape[:-1] + (y.shape[1],))
    squeeze_x, squeeze_y = x.ndim == 1, y.ndim == 1
    if squeeze_x:
        x = x.unsqueeze(0)
    if squeeze_y:
        y = y.unsqueeze(1)
    if x.shape[-1] != y.shape[-2]:
        raise ShapeError(
            f"matmul: shapes {a.shape} and {b.shape} do not fit: the last dim of the first ({x.shape[-1]}) "
            f"must equal the second-to-last dim of the second ({y.shape[-2]})")
    dtype = D.promote(x.dtype, y.dtype)
    if x.dtype is not dtype:
        x = x.to(dtype)
    if y.dtype is not dtype:
        y = y.to(dtype)
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2], "matmul")
    lx = x._layout.broadcast_to(batch + x.shape[-2:], "matmul")
    ly = y._layout.broadcast_to(batch + y.shape[-2:], "matmul")
    out = x._new(x.device.backend.matmul(Operand(x._storage, lx), Operand(y._storage, ly), dtype),
                 batch + (x.shape[-2], y.shape[-1]), dtype)
    out = record_if_needed(out, (x, y), lambda: G.matmul(x, y))
    if squeeze_x:
        out = out.squeeze(-2)
    if squeeze_y:
        out = out.squeeze(-1)
    return out
