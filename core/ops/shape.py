"""Views (reshape, permute, transpose, narrow, squeeze, unsqueeze, expand: a new
Layout over the same storage) and the ops that join or split along a dim."""
from .. import dtypes as D
from .. import grad_rules as G
from ..autograd import _Mode, record, record_if_needed
from ..errors import DeviceError, ShapeError, UnsupportedError
from ..layout import Layout, numel_of
from .arguments import dim_index, shape_args
from .new import new_full


def reshape(x, shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):  # shape_args, inlined: the hot path
        shape = tuple(shape[0])
    lay = x._layout
    if lay.is_contiguous() and -1 not in shape and numel_of(shape) == numel_of(lay.shape) \
            and all(type(s) is int and s >= 0 for s in shape):
        # fast path: a plain view (at an offset: k and v in a joined q/k/v projection's output)
        out = x._view(Layout(shape, None, lay.offset))
        if x.requires_grad and _Mode.enabled:
            old = lay.shape
            record(out, (x,), lambda g: (g.reshape(old),))
        return out
    shape = _infer_shape(shape, x.numel(), x.shape)
    new = lay.reshaped(shape)
    if new is None:
        if x.dtype.is_quantized:
            raise UnsupportedError("reshape of a strided quantised view")
        return reshape(contiguous(x), shape)
    old = x.shape
    return record_if_needed(x._view(new), (x,), lambda: (lambda g: (g.reshape(old),)))


def _infer_shape(shape, numel, old):
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dim can be -1, got {shape}")
    if -1 in shape:
        known = numel_of([s for s in shape if s != -1])
        if known == 0 or numel % known:
            raise ShapeError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if numel_of(shape) != numel:
        raise ShapeError(f"reshape: cannot reshape {old} ({numel} elements) into {shape} ({numel_of(shape)} elements)")
    return shape


def contiguous(x):
    if x._layout.is_contiguous() and x._layout.offset == 0:
        return x
    if x.dtype.is_quantized:
        raise UnsupportedError("a quantised tensor cannot be copied into a new layout; "
                               "dequantise it first with .to(tallow.f32)")
    return x.clone()


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = dim_index(start_dim, x.ndim, "flatten"), dim_index(end_dim, x.ndim, "flatten")
    return reshape(x, x.shape[:s] + (numel_of(x.shape[s:e + 1]),) + x.shape[e + 1:])


def permute(x, dims):
    dims = tuple(dim_index(d, x.ndim, "permute") for d in shape_args(dims))
    if sorted(dims) != list(range(x.ndim)):
        raise ShapeError(f"permute: {dims} is not a permutation of the {x.ndim} dims of shape {x.shape}")
    inverse = tuple(dims.index(i) for i in range(len(dims)))
    return record_if_needed(x._view(x._layout.permute(dims)), (x,), lambda: (lambda g: (g.permute(inverse),)))


def transpose(x, d0=-2, d1=-1):
    lay = x._layout
    n = len(lay.shape)
    if n < 2 and d0 in (-2, 0) and d1 in (-1, 0):
        return x
    d0, d1 = dim_index(d0, n, "transpose"), dim_index(d1, n, "transpose")
    shape, strides = list(lay.shape), list(lay.strides)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    strides[d0], strides[d1] = strides[d1], strides[d0]
    out = x._view(Layout(shape, strides, lay.offset))
    if x.requires_grad and _Mode.enabled:
        record(out, (x,), lambda g: (g.transpose(d0, d1),))
    return out


def t(x):
    n = len(x._layout.shape)
    if n > 2:
        raise ShapeError(f"t() expects a tensor with <= 2 dims, got shape {x.shape}; use transpose(d0, d1)")
    return transpose(x, 0, 1) if n == 2 else x


def narrow(x, dim, start, length):
    dim = dim_index(dim, x.ndim, "narrow")
    size = x.shape[dim]
    if start < 0:
        start += size
    if not (0 <= start and length >= 0 and start + length <= size):
        raise ShapeError(f"narrow: [{start}, {start + length}) is outside dim {dim} of size {size} (shape {x.shape})")
    out = x._view(x._layout.narrow(dim, start, length))
    if x.requires_grad and _Mode.enabled:  # (as transpose: no closure made when nothing is recorded)
        record(out, (x,), G.view_into(x.shape, (slice(None),) * dim + (slice(start, start + length),)))
    return out


def squeeze(x, dim=None):
    lay = x._layout
    if dim is None:
        keep = [i for i, s in enumerate(lay.shape) if s != 1]
    else:
        dims = {dim_index(d, x.ndim, "squeeze") for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        keep = [i for i, s in enumerate(lay.shape) if not (i in dims and s == 1)]
    out = x._view(Layout([lay.shape[i] for i in keep], [lay.strides[i] for i in keep], lay.offset))
    return record_if_needed(out, (x,), lambda: (lambda g: (g.reshape(lay.shape),)))


def unsqueeze(x, dim):
    dim = dim_index(dim, x.ndim + 1, "unsqueeze")
    lay = x._layout
    stride = lay.strides[dim] * lay.shape[dim] if dim < x.ndim else 1
    out = x._view(Layout(lay.shape[:dim] + (1,) + lay.shape[dim:], lay.strides[:dim] + (stride,) + lay.strides[dim:],
                         lay.offset))
    return record_if_needed(out, (x,), lambda: (lambda g: (g.reshape(lay.shape),)))


def expand(x, shape):
    shape = shape_args(shape)
    extra = len(shape) - x.ndim
    shape = tuple(x.shape[i - extra] if s == -1 else s for i, s in enumerate(shape))
    return record_if_needed(x._view(x._layout.broadcast_to(shape, "expand")), (x,), lambda: (lambda g: (g,)))


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat: needs at least one tensor")
    first = tensors[0]
    dim = dim_index(dim, first.ndim, "cat")
    if any(x.dtype.is_quantized for x in tensors):
        return _cat_quantised(tensors, dim)
    dtype = first.dtype
    for x in tensors[1:]:
        if x.device is not first.device:
            raise DeviceError(f"cat: tensors are on {first.device} and {x.device}")
        dtype = D.promote(dtype, x.dtype)
        if x.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != dim):
            raise ShapeError(f"cat: shapes {first.shape} and {x.shape} differ outside dim {dim}")
    shape = list(first.shape)
    shape[dim] = sum(x.shape[dim] for x in tensors)
    out = new_full(first, shape, 0, dtype)
    be = first.device.backend
    pos = 0
    for x in tensors:
        n = x.shape[dim]
        if n:
            src = x.to(dtype)
            be.assign(out._storage, out._layout.narrow(dim, pos, n), src._storage, src._layout, dtype)
        pos += n
    return record_if_needed(out, tensors, lambda: G.cat(tensors, dim))


def _cat_quantised(tensors, dim):
    """Whole quantised (rows, k) matrices of one block format joined along dim 0 (block rows are
    runs of whole blocks, so this joins their bytes)."""
    first = tensors[0]
    for x in tensors:
        if (x.dtype is not first.dtype or dim != 0 or x.ndim != 2 or x.shape[1] != first.shape[1]
                or x.device is not first.device or x._layout.offset or not x._layout.is_contiguous()):
            raise UnsupportedError("cat of quantised tensors: only whole (rows, k) matrices of one block format "
                                   f"and width along dim 0, on one device (got {x.dtype.name} {x.shape} with "
                                   f"{first.dtype.name} {first.shape}, dim {dim})")
    st = first.device.backend.concat_rows([(x._storage, x._layout) for x in tensors], first.dtype)
    return first._new(st, (sum(x.shape[0] for x in tensors), first.shape[1]))


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack: needs at least one tensor")
    for x in tensors[1:]:
        if x.shape != tensors[0].shape:
            raise ShapeError(f"stack: all shapes must be equal, got {tensors[0].shape} and {x.shape}")
    dim = dim_index(dim, tensors[0].ndim + 1, "stack")
    return cat([unsqueeze(x, dim) for x in tensors], dim)


def split(x, split_size, dim=0):
    dim = dim_index(dim, x.ndim, "split")
    size = x.shape[dim]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise ShapeError(f"split: split_size must be positive, got {split_size}")
        sizes = [min(split_size, size - i) for i in range(0, size, split_size)] or [0]
    else:
        sizes = list(split_size)
        if sum(sizes) != size:
            raise ShapeError(f"split: sizes {sizes} do not add up to {size} (dim {dim} of shape {x.shape})")
    out, pos = [], 0
    for s in sizes:
        out.append(narrow(x, dim, pos, s))
        pos += s
    return tuple(out)


def chunk(x, chunks, dim=0):
    dim = dim_index(dim, x.ndim, "chunk")
    return split(x, max(1, -(-x.shape[dim] // chunks)), dim)


def pad(x, pads, value=0.0):
    """torch-style constant padding: pads = (last_lo, last_hi, second_last_lo, ...)."""
    if len(pads) % 2 or len(pads) // 2 > x.ndim:
        raise ShapeError(f"pad: {pads} must hold (lo, hi) pairs for at most {x.ndim} dims")
    shape = list(x.shape)
    offsets = [0] * x.ndim
    for i in range(len(pads) // 2):
        d = x.ndim - 1 - i
        lo, hi = pads[2 * i], pads[2 * i + 1]
        if lo < 0 or hi < 0:
            raise ShapeError("pad: negative padding is not supported; use narrow")
        shape[d] += lo + hi
        offsets[d] = lo
    out = new_full(x, shape, value)
    view = out._layout
    for d in range(x.ndim):
        view = view.narrow(d, offsets[d], x.shape[d])
    if x.numel():
        x.device.backend.assign(out._storage, view, x._storage, x._layout, x.dtype)
    key = tuple(slice(o, o + n) for o, n in zip(offsets, x.shape))
    return record_if_needed(out, (x,), lambda: (lambda g: (g[key],)))
