"""t[key] and t[key] = value: ints, slices (with steps), None, Ellipsis, one
integer-tensor/list index, or a boolean mask.

The key becomes a view (a Layout over the same storage) here; picking by ids and
writing go through the op front end (ops.index_select, ops.assign)."""
from . import dtypes as D
from . import grad_rules as G
from . import ops
from .autograd import record_if_needed
from .errors import IndexRangeError, ShapeError, UnsupportedError
from .layout import Layout
from .tensor_base import TensorBase


def _expand_key(t, key):
    if not isinstance(key, tuple):
        key = (key,)
    used = (sum(1 for k in key if k is not None and k is not Ellipsis and not _is_mask(k))
            + sum(k.ndim for k in key if _is_mask(k)))
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise ShapeError("an index can hold only one Ellipsis (...)")
    if used > t.ndim:
        raise ShapeError(f"too many indices ({used}) for a tensor of shape {t.shape}")
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (t.ndim - used))
        else:
            out.append(k)
    return out


def _is_mask(k):
    return isinstance(k, TensorBase) and k.dtype is D.bool_


def _is_int(k):
    return isinstance(k, int) or (hasattr(k, "__index__") and not isinstance(k, (TensorBase, list, tuple)))


def _basic(t, key):
    """Apply ints/slices/None as a view. Returns the view and, for an advanced
    index, (its position in the view, the index)."""
    lay = t._layout
    shape, strides, offset = [], [], lay.offset
    advanced = None
    d = 0
    for k in key:
        if k is None:
            shape.append(1)
            strides.append(0)
            continue
        size, stride = lay.shape[d], lay.strides[d]
        if isinstance(k, bool):
            raise UnsupportedError("indexing with a Python bool")
        if _is_int(k):
            i = k.__index__()
            if not -size <= i < size:
                raise IndexRangeError(f"index {i} is out of range for dim {d} of size {size} (shape {t.shape})")
            offset += (i % size) * stride
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            if step <= 0:
                raise UnsupportedError("negative slice steps are not supported; use flip via index_select")
            n = max(0, (stop - start + step - 1) // step)
            shape.append(n)
            strides.append(stride * step)
            if n:
                offset += start * stride
        else:
            if advanced is not None:
                raise UnsupportedError("only one integer-tensor index per indexing expression is supported")
            advanced = (len(shape), k)
            shape.append(size)
            strides.append(stride)
        d += 1
    shape.extend(lay.shape[d:])
    strides.extend(lay.strides[d:])
    return t._view(Layout(shape, strides, offset)), advanced


def _basic_part(key):
    """The key with its advanced index replaced by a full slice: the view _basic makes."""
    return tuple(k if k is None or isinstance(k, slice) or _is_int(k) else slice(None) for k in key)


def getitem(t, key):
    if _is_mask(key):
        if key.shape != t.shape[:key.ndim]:
            raise ShapeError(f"boolean mask of shape {key.shape} does not match the tensor's leading dims {t.shape}")
        rows = [i for i, m in enumerate(key.reshape(-1).tolist()) if m]
        flat = t.reshape((-1,) + t.shape[key.ndim:])
        return ops.index_select(flat, 0, ops.as_index(rows, t, "mask"))
    key = _expand_key(t, key)
    view, advanced = _basic(t, key)
    view = record_if_needed(view, (t,), lambda: G.view_into(t.shape, _basic_part(key)))
    if advanced is None:
        return view
    pos, index = advanced
    index = ops.as_index(index, t, "indexing")
    size = view.shape[pos]
    flat_index = index.reshape(-1)
    ids = flat_index.tolist()
    bad = next((i for i in ids if not -size <= i < size), None)
    if bad is not None:
        raise IndexRangeError(f"indexing: index {bad} is out of range for dim {pos} of size {size} "
                              f"(valid: {-size} to {size - 1})")
    if any(i < 0 for i in ids):
        flat_index = ops.as_index([i % size for i in ids], t, "indexing")
    picked = ops.index_select(view, pos, flat_index)
    return picked.reshape(view.shape[:pos] + index.shape + view.shape[pos + 1:])


def setitem(t, key, value):
    """In-place write through a basic-index view (the KV cache uses this)."""
    view, advanced = _basic(t, _expand_key(t, key))
    if advanced is not None:
        raise UnsupportedError("assignment through an integer-tensor index; use scatter_add or where")
    ops.assign(t, view._layout, value)
