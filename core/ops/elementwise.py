"""Element-wise ops: unary (one table), binary and comparisons with promotion and
broadcasting, where, dtype casts and device moves."""
import math

from .. import dtypes as D
from .. import grad_rules as G
from ..autograd import _Mode, record, record_if_needed
from ..backends.operand import Operand
from ..device import Device
from ..errors import DTypeError
from ..layout import Layout, broadcast_shapes
from ..tensor_base import TensorBase
from .arguments import same_device
from .new import new_full, new_values
from .quantized import dequantize, quantize

_SQRT_2PI = math.sqrt(2 * math.pi)
_GELU_C = math.sqrt(2 / math.pi)


def _silu_grad(x, y, arg, g):
    s = x.sigmoid()
    return g * s * (1.0 + x * (1.0 - s))


def _gelu_grad(x, y, arg, g):
    zero = x == 0
    cdf = (y / x.masked_fill(zero, 1.0)).masked_fill(zero, 0.5)  # Phi(x) = gelu(x) / x
    pdf = (x * x * -0.5).exp() * (1 / _SQRT_2PI)
    return g * (cdf + x * pdf)


def _gelu_tanh_grad(x, y, arg, g):
    t = ((x + x * x * x * 0.044715) * _GELU_C).tanh()
    return g * ((1.0 + t) * 0.5 + x * 0.5 * (1.0 - t * t) * _GELU_C * (1.0 + x * x * (3 * 0.044715)))


def _clamp_grad(x, y, arg, g):
    lo, hi = arg
    m = (x >= lo).to(g.dtype) if lo is not None else None
    if hi is not None:
        mh = (x <= hi).to(g.dtype)
        m = mh if m is None else m * mh
    return g if m is None else g * m


# Every unary op: name -> (integer/bool inputs promote to f32 first, as in torch;
# the gradient as a function of (x, y = op(x), arg, grad of y), or None: zero gradient).
# The name is the op the backends implement (Backend.unary).
UNARY = {
    "neg": (False, lambda x, y, arg, g: -g),
    "abs": (False, lambda x, y, arg, g: g * x.sign()),
    "exp": (True, lambda x, y, arg, g: g * y),
    "expm1": (True, lambda x, y, arg, g: g * (y + 1.0)),
    "log": (True, lambda x, y, arg, g: g / x),
    "sqrt": (True, lambda x, y, arg, g: g * 0.5 / y),
    "rsqrt": (True, lambda x, y, arg, g: g * -0.5 * y * y * y),
    "sin": (True, lambda x, y, arg, g: g * x.cos()),
    "cos": (True, lambda x, y, arg, g: -g * x.sin()),
    "tanh": (True, lambda x, y, arg, g: g * (1.0 - y * y)),
    "sigmoid": (True, lambda x, y, arg, g: g * y * (1.0 - y)),
    "relu": (False, lambda x, y, arg, g: g * (x > 0).to(g.dtype)),
    "silu": (True, _silu_grad),
    "gelu": (True, _gelu_grad),
    "gelu_tanh": (True, _gelu_tanh_grad),
    "square": (False, lambda x, y, arg, g: g * 2.0 * x),
    "reciprocal": (True, lambda x, y, arg, g: -g * y * y),
    "clamp": (False, _clamp_grad),
    "pow_scalar": (False, lambda x, y, arg, g: g * arg * x.pow(arg - 1)),
    "affine": (False, lambda x, y, arg, g: g * arg[0]),
    "floor": (False, None),
    "ceil": (False, None),
    "round": (False, None),
    "sign": (False, None),
    "logical_not": (False, None),
}


def unary(x, op, arg=None):
    to_float, grad = UNARY[op]
    if to_float and not x.dtype.is_float:
        x = x.to(D.f32)
    out_dtype = D.bool_ if op == "logical_not" else x.dtype
    out = x._new(x.device.backend.unary(op, x._storage, x._layout, x.dtype, arg), x.shape, out_dtype)
    if x.requires_grad and _Mode.enabled:
        record(out, (x,), (lambda g: (None,)) if grad is None else (lambda g: (grad(x, out, arg, g),)))
    return out


def gelu(x, approximate="none"):
    """GELU; approximate="none" is the erf form, "tanh" the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return unary(x, "gelu" if approximate == "none" else "gelu_tanh")


def pow(x, exponent):
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        if not x.dtype.is_float and (isinstance(exponent, float) or exponent < 0):
            x = x.to(D.f32)
        if exponent == 2:
            return unary(x, "square")
        return unary(x, "pow_scalar", exponent)
    return binary(x, exponent, "pow")


def _operand(a, other, op):
    """other as a tensor on a's device, and the dtype the op computes in; (None, None) when
    other is neither a tensor nor a number (the operator then returns NotImplemented)."""
    if isinstance(other, TensorBase):
        same_device(op, a, other)
        return other, D.promote(a.dtype, other.dtype)
    if isinstance(other, (list, tuple)):
        other = new_values(a, other, op=op)
        return other, D.promote(a.dtype, other.dtype)
    if not isinstance(other, (int, float, bool)):
        try:
            other = float(other)
        except TypeError:
            return None, None
    dtype = D.promote_scalar(a.dtype, other)
    return a._new(a.device.backend.full(1, other, dtype), (), dtype), dtype


# Binary ops whose result is a bool tensor (Backend.compare); the others keep the promoted dtype (Backend.binary).
COMPARISONS = frozenset(("eq", "ne", "lt", "le", "gt", "ge"))


def binary(a, other, op, reverse=False):
    """a op other (other op a when reverse); other a tensor or a Python number, broadcast."""
    if op not in COMPARISONS and type(other) is type(a) and other.dtype is a.dtype \
            and other._layout.shape == a._layout.shape and other.device is a.device \
            and (op != "div" or a.dtype.kind == "f"):
        # Fast path (same dtype, same shape): nothing to promote or broadcast.
        if reverse:
            a, other = other, a
        out = a._new(a.device.backend.binary(op, a._storage, a._layout, other._storage, other._layout, a.dtype),
                     a._layout.shape)
        if (a.requires_grad or other.requires_grad) and _Mode.enabled:
            record(out, (a, other), G.binary(op, a, other, out))
        return out
    b, dtype = _operand(a, other, op)
    if b is None:
        return NotImplemented
    if reverse:
        a, b = b, a
    if op == "div" and not dtype.is_float:
        dtype = D.f32  # true division, as in torch
    if a.dtype is not dtype:
        a = a.to(dtype)
    if b.dtype is not dtype:
        b = b.to(dtype)
    shape = broadcast_shapes(a.shape, b.shape, op)
    la = a._layout if a.shape == shape else a._layout.broadcast_to(shape, op)
    lb = b._layout if b.shape == shape else b._layout.broadcast_to(shape, op)
    be = a.device.backend
    if op in COMPARISONS:
        return a._new(be.compare(op, a._storage, la, b._storage, lb, dtype), shape, D.bool_)
    out = a._new(be.binary(op, a._storage, la, b._storage, lb, dtype), shape, dtype)
    return record_if_needed(out, (a, b), lambda: G.binary(op, a, b, out))


def logical(a, other, op):
    """& (op "mul") and | (op "maximum") on bool tensors."""
    if a.dtype is not D.bool_ or (isinstance(other, TensorBase) and other.dtype is not D.bool_):
        raise DTypeError("& and | are defined on bool tensors")
    return binary(a, other, op)


def where(cond, a, b):
    """a where cond else b; a and b may be tensors or Python scalars; all broadcast together."""
    if not isinstance(cond, TensorBase):
        raise DTypeError("where: the condition must be a bool tensor")
    if cond.dtype is not D.bool_:
        cond = cond.ne(0)
    ta = a if isinstance(a, TensorBase) else None
    tb = b if isinstance(b, TensorBase) else None
    if ta is None and tb is None:
        dtype = D.promote(D.default_for(a), D.default_for(b))
        ta, tb = new_full(cond, (), a, dtype), new_full(cond, (), b, dtype)
    elif ta is None:
        ta = new_full(cond, (), a, D.promote_scalar(tb.dtype, a))
    elif tb is None:
        tb = new_full(cond, (), b, D.promote_scalar(ta.dtype, b))
    same_device("where", cond, ta)
    same_device("where", cond, tb)
    dtype = D.promote(ta.dtype, tb.dtype)
    ta, tb = ta.to(dtype), tb.to(dtype)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, ta.shape, "where"), tb.shape, "where")
    st = cond.device.backend.where(*(Operand(x._storage, x._layout.broadcast_to(shape)) for x in (cond, ta, tb)),
                                   dtype)
    return record_if_needed(ta._new(st, shape, dtype), (None, ta, tb), lambda: G.where(cond))


def cast(x, dtype):
    """x converted to dtype (float, integer, bool or a quantised block format)."""
    if dtype is x.dtype:
        return x
    if x.dtype.is_quantized:
        return dequantize(x, dtype)
    if dtype.is_quantized:
        return quantize(x, dtype)
    out = x._new(x.device.backend.cast(x._storage, x._layout, x.dtype, dtype), x.shape, dtype)
    return record_if_needed(out, (x,), lambda: G.cast(x.dtype)) if dtype.is_float else out


def to_device(x, device):
    """x copied to another device (through its bytes); the gradient flows back."""
    if device is x.device:
        return x
    layout = x._layout if x.dtype.is_quantized else Layout(x.shape)
    out = x._on_device(device.backend.from_bytes(bytes(x), x.dtype), layout, device)
    src = x.device
    return record_if_needed(out, (x,), lambda: (lambda g: (g.to(src),)))


def parse_target(target):
    """t.to(target): (Device or None, DType or None) from a device or dtype name, or either object."""
    if isinstance(target, Device):
        return target, None
    try:
        return None, D.get_dtype(target)
    except DTypeError:
        return Device(target), None


def clone(x):
    out = x._new(x.device.backend.copy(x._storage, x._layout, x.dtype), x.shape)
    return record_if_needed(out, (x,), lambda: (lambda g: (g,)))
