"""Tensors made on another tensor's device (torch's x.new_full / x.new_tensor), for
the front end's own use: a scalar operand, an index list, a causal mask's positions.
User-facing creation (tallow.tensor, zeros, arange, ...) lives in creation.py."""
from .. import dtypes as D
from ..layout import numel_of
from ..nested import coerce, flatten_nested, infer_dtype


def new_full(like, shape, value, dtype=None):
    """A tensor of `shape` filled with value, on like's device (like's dtype unless given)."""
    dtype = D.get_dtype(dtype) or like.dtype
    if dtype.is_int:
        D.check_ints_fit([value], dtype, "full")
    shape = tuple(shape)
    return like._new(like.device.backend.full(numel_of(shape), value, dtype), shape, dtype)


def new_values(like, data, dtype=None, op="tensor"):
    """A tensor of nested Python values on like's device."""
    flat, shape = flatten_nested(data)
    dtype = dtype or infer_dtype(flat)
    return like._new(like.device.backend.from_list(coerce(flat, dtype, op), dtype), shape, dtype)


def new_arange(like, n):
    """0, 1, ..., n - 1 as i64 on like's device."""
    return like._new(like.device.backend.arange(0, 1, n, D.i64), (n,), D.i64)
