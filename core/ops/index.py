"""Ops that pick or write elements by integer ids (index_select, gather, scatter_add)
and the in-place write behind t[key] = value."""
from .. import dtypes as D
from .. import grad_rules as G
from ..autograd import record_if_needed
from ..backends.operand import operand_of
from ..errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from ..index_check import check_ids
from ..tensor_base import TensorBase
from .arguments import dim_index, same_device
from .new import new_full, new_values
from .quantized import rows

_INDEX_DTYPES = (D.i64, D.i32, D.u32, D.u8, D.i8)


def as_index(index, like, op):
    """index (a tensor or nested ints) as an integer tensor on like's device."""
    if not isinstance(index, TensorBase):
        index = new_values(like, index, D.i64, op)
    if index.dtype not in _INDEX_DTYPES:
        raise DTypeError(f"{op}: the index must be an integer tensor, got {index.dtype.name}")
    if index.device is not like.device:
        raise DeviceError(f"{op}: the index is on {index.device}, the tensor on {like.device}")
    return index


def index_select(x, dim, index):
    dim = dim_index(dim, x.ndim, "index_select")
    index = as_index(index, x, "index_select")
    if index.ndim != 1:
        raise ShapeError(f"index_select: the index must be 1-D, got shape {index.shape}")
    check_ids(index, x.shape[dim], "index_select", dim)
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    shape = tuple(shape)
    if x.dtype.is_quantized:
        if dim != 0:
            raise UnsupportedError("index_select on a quantised tensor picks rows (dim 0) only")
        return rows(x, index, shape)
    st = x.device.backend.index_select(operand_of(x), operand_of(index), x.dtype, dim)
    return record_if_needed(x._new(st, shape), (x,), lambda: G.index_select(x, dim, index))


def gather(x, dim, index):
    dim = dim_index(dim, x.ndim, "gather")
    index = as_index(index, x, "gather")
    if index.ndim != x.ndim:
        raise ShapeError(f"gather: index shape {index.shape} needs as many dims as the input {x.shape}")
    for d, (si, sx) in enumerate(zip(index.shape, x.shape)):
        if d != dim and si > sx:
            raise ShapeError(f"gather: index shape {index.shape} is larger than input {x.shape} in dim {d}")
    check_ids(index, x.shape[dim], "gather", dim)
    st = x.device.backend.gather(operand_of(x), operand_of(index), x.dtype, dim)
    return record_if_needed(x._new(st, index.shape), (x,), lambda: G.gather(x, dim, index))


def scatter_add(x, dim, index, src):
    dim = dim_index(dim, x.ndim, "scatter_add")
    index = as_index(index, x, "scatter_add")
    if index.shape != src.shape:
        raise ShapeError(f"scatter_add: index shape {index.shape} must equal src shape {src.shape}")
    check_ids(index, x.shape[dim], "scatter_add", dim)
    src = src.to(x.dtype)
    st = x.device.backend.scatter_add(operand_of(x), operand_of(index), operand_of(src), x.dtype, dim)
    return record_if_needed(x._new(st, x.shape), (x, src), lambda: G.scatter_add(dim, index))


def assign(x, view_layout, value):
    """Write value (a tensor or a Python number, broadcast) into x through view_layout, in place."""
    if not isinstance(value, TensorBase):
        value = new_full(x, (), value)
    same_device("assignment", x, value)
    value = value.to(x.dtype)
    src = value._layout.broadcast_to(view_layout.shape, "setitem")
    if view_layout.numel():
        x.device.backend.assign(x._storage, view_layout, value._storage, src, x.dtype)
