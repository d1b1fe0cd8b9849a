"""Nested Python sequences <-> flat values and a shape (for tensor(...) and tolist())."""
from . import dtypes as D
from .errors import DTypeError, ShapeError
from .layout import numel_of


_SCALARS = (int, float, bool)


def flatten_nested(data):
    """(flat values, shape) of a nested list/tuple; ragged input is a ShapeError.
    Items with a tolist() method (tensors, numpy arrays) are read through it."""
    if isinstance(data, (list, tuple)):
        if not data:
            return [], (0,)
        if all(type(x) in _SCALARS for x in data):  # flat: the common case, no call per value
            return list(data), (len(data),)
        parts = [flatten_nested(x) for x in data]
        shape = parts[0][1]
        if any(p[1] != shape for p in parts):
            raise ShapeError(f"tensor: ragged nested sequence (sub-shapes {sorted({p[1] for p in parts})})")
        return [v for p in parts for v in p[0]], (len(data),) + shape
    if not isinstance(data, (int, float, bool)) and hasattr(data, "tolist"):
        return flatten_nested(data.tolist())
    return [data], ()


def infer_dtype(flat):
    """The dtype torch would pick for these Python values: f32, bool or i64."""
    if any(isinstance(v, float) for v in flat):
        return D.f32
    if flat and all(isinstance(v, bool) for v in flat):
        return D.bool_
    return D.i64


def coerce(flat, dtype, op):
    """The values as the Python type a backend's from_list takes for dtype, range-checked."""
    for v in flat:
        if not isinstance(v, (int, float, bool)):
            try:
                float(v)
            except (TypeError, ValueError):
                raise DTypeError(f"{op}: cannot make a tensor from a {type(v).__name__}") from None
    if dtype.is_float:
        return [float(v) for v in flat]
    if dtype is D.bool_:
        return [bool(v) for v in flat]
    D.check_ints_fit(flat, dtype, op)
    return [int(v) for v in flat]


def nest(flat, shape):
    """Flat values as nested lists of the shape (a 0-d shape gives the one value)."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = numel_of(shape[1:])
    return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
