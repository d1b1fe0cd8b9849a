"""Argument checks shared by the op front end: dims, devices, float inputs.

The front end never imports the Tensor class (tensor.py imports the front end);
it recognises a tensor as an object of the same class as an input it was given.
"""
from .. import dtypes as D
from ..errors import DeviceError, DTypeError, ShapeError


def dim_index(d, ndim, op):
    """d as a dim in [0, ndim): negative dims count from the end."""
    if 0 <= d < ndim:
        return d
    if not -ndim <= d < max(ndim, 1):
        raise ShapeError(f"{op}: dim {d} is out of range for a tensor with {ndim} dims")
    return d % ndim if ndim else 0


def dims_of(x, dim, op):
    """The sorted dims a reduction over `dim` (None: all, an int, or a sequence) covers."""
    if dim is None:
        return tuple(range(x.ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(sorted({dim_index(d, x.ndim, op) for d in dims}))


def shape_args(shape):
    """A shape given as f(2, 3) or f((2, 3))."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return shape


def same_device(op, a, b):
    if a.device is not b.device:
        raise DeviceError(f"{op}: tensors are on different devices ({a.device} and {b.device}); move one with .to()")


def check_devices(op, *tensors):
    """All the tensors given (None skipped) are on the first one's device."""
    dev = tensors[0].device
    for t in tensors[1:]:
        if t is not None and t.device is not dev:
            raise DeviceError(f"{op}: tensors are on {dev} and {t.device}")


def float_input(x, op):
    """x as a float tensor (integers promote to f32); a quantised tensor is refused."""
    if x.dtype.is_quantized:
        raise DTypeError(f"{op}: quantised input; dequantise it first with .to(tallow.f32)")
    return x if x.dtype.is_float else x.to(D.f32)
