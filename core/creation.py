"""Making tensors, and the ops that join or pick among several of them."""
import math
import random as _pyrandom

from . import dtypes as D
from . import grad_rules as G
from .device import Device, default_device
from .errors import DeviceError, DTypeError, FormatError, ShapeError
from .layout import Layout, numel_of
from .tensor import Tensor, _dim


def _device(device):
    return default_device() if device is None else Device(device)


def _make(storage, shape, dtype, device):
    return Tensor(storage, Layout(tuple(shape)), dtype, device)


def _leaf(t, requires_grad, op):
    """t as a leaf that records gradients when asked (torch's `requires_grad=` argument);
    integer and bool tensors cannot carry gradients, as in torch."""
    if requires_grad:
        if not t.dtype.is_float:
            raise DTypeError(f"{op}: requires_grad=True needs a float dtype (f32, f16, bf16, f64), got {t.dtype.name}; "
                             f"pass dtype=tallow.f32 or leave requires_grad off")
        t.requires_grad = True
    return t


def _flatten_nested(data):
    """(flat values, shape) of a nested list/tuple; ragged input is a ShapeError."""
    if isinstance(data, (list, tuple)):
        if not data:
            return [], (0,)
        parts = [_flatten_nested(x) for x in data]
        shape = parts[0][1]
        if any(p[1] != shape for p in parts):
            raise ShapeError(f"tensor: ragged nested sequence (sub-shapes {sorted({p[1] for p in parts})})")
        return [v for p in parts for v in p[0]], (len(data),) + shape
    if isinstance(data, Tensor):
        return _flatten_nested(data.tolist())
    return [data], ()


def _infer_dtype(flat):
    if any(isinstance(v, float) for v in flat):
        return D.f32
    if flat and all(isinstance(v, bool) for v in flat):
        return D.bool_
    return D.i64


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A tensor from nested lists, a scalar, a numpy array or another tensor (copied);
    requires_grad=True makes it a leaf that records gradients."""
    return _leaf(_tensor(data, dtype, device), requires_grad, "tensor")


def _tensor(data, dtype, device):
    dtype = D.get_dtype(dtype)
    dev = _device(device)
    if isinstance(data, Tensor):
        return data.detach().to(dev).to(dtype or data.dtype).clone()
    if hasattr(data, "__array_interface__") or type(data).__module__ == "numpy":
        t = from_numpy(data, device=dev)
        return t.to(dtype) if dtype else t
    flat, shape = _flatten_nested(data)
    for v in flat:
        if not isinstance(v, (int, float, bool)):
            try:
                float(v)
            except (TypeError, ValueError):
                raise DTypeError(f"tensor: cannot make a tensor from a {type(v).__name__}") from None
    dtype = dtype or _infer_dtype(flat)
    if dtype.is_quantized:
        return _tensor(data, D.f32, dev).to(dtype)
    if dtype.is_float:
        flat = [float(v) for v in flat]
    elif dtype is D.bool_:
        flat = [bool(v) for v in flat]
    else:
        D.check_ints_fit(flat, dtype, "tensor")
        flat = [int(v) for v in flat]
    return _make(dev.backend.from_list(flat, dtype), shape, dtype, dev)


def from_numpy(array, device=None, requires_grad=False):
    """A tensor holding a copy of a numpy array (bf16 is not a numpy dtype: pass uint16 bits through from_buffer)."""
    import numpy as np
    array = np.asarray(array)
    if array.dtype == np.float64 or array.dtype.kind in "fiub":
        try:
            dtype = D.get_dtype(array.dtype.name)
        except DTypeError:
            raise DTypeError(f"from_numpy: numpy dtype {array.dtype} has no tallow equivalent") from None
    else:
        raise DTypeError(f"from_numpy: numpy dtype {array.dtype} has no tallow equivalent")
    data = np.array(array, dtype=array.dtype.newbyteorder("<"), order="C", copy=True).reshape(-1)
    return _leaf(from_buffer(memoryview(data.view(np.uint8)), dtype, array.shape, device), requires_grad, "from_numpy")


def from_buffer(data, dtype, shape, device=None):
    """A tensor over raw little-endian bytes (quantised dtypes: the GGUF blocks)."""
    dtype = D.get_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    numel = numel_of(shape)
    if dtype.is_quantized and (not shape or shape[-1] % dtype.block_size):
        raise ShapeError(f"from_buffer: a {dtype.name} tensor's last dim must be a multiple of {dtype.block_size}, got shape {shape}")
    expected = dtype.nbytes(numel)
    got = memoryview(data).nbytes
    if got != expected:
        raise FormatError(f"from_buffer: {got} bytes given for a {dtype.name} tensor of shape {shape}, which needs {expected}")
    dev = _device(device)
    return _make(dev.backend.from_bytes(data, dtype), shape, dtype, dev)


def full(shape, value, dtype=None, device=None, requires_grad=False):
    shape = _shape_arg(shape)
    dtype = D.get_dtype(dtype) or D.default_for(value)
    if dtype.is_int:
        D.check_ints_fit([value], dtype, "full")
    dev = _device(device)
    return _leaf(_make(dev.backend.full(numel_of(shape), value, dtype), shape, dtype, dev), requires_grad, "full")


def zeros(*shape, dtype=D.f32, device=None, requires_grad=False):
    return _leaf(full(_shape_arg(shape), 0, dtype, device), requires_grad, "zeros")


def empty(*shape, dtype=D.f32, device=None, requires_grad=False):
    """torch.empty's spelling; tallow fills it with zeros (no uninitialised memory)."""
    return _leaf(full(_shape_arg(shape), 0, dtype, device), requires_grad, "empty")


def ones(*shape, dtype=D.f32, device=None, requires_grad=False):
    return _leaf(full(_shape_arg(shape), 1, dtype, device), requires_grad, "ones")


def zeros_like(t, dtype=None, device=None, requires_grad=False):
    return _leaf(full(t.shape, 0, dtype or t.dtype, device or t.device), requires_grad, "zeros_like")


def ones_like(t, dtype=None, device=None, requires_grad=False):
    return _leaf(full(t.shape, 1, dtype or t.dtype, device or t.device), requires_grad, "ones_like")


def full_like(t, value, dtype=None, device=None, requires_grad=False):
    return _leaf(full(t.shape, value, dtype or t.dtype, device or t.device), requires_grad, "full_like")


def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"negative dimension in shape {shape}")
    return shape


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, math.ceil((end - start) / step))
    dtype = D.get_dtype(dtype) or (D.f32 if any(isinstance(v, float) for v in (start, end, step)) else D.i64)
    dev = _device(device)
    return _leaf(_make(dev.backend.arange(start, step, n, dtype), (n,), dtype, dev), requires_grad, "arange")


def linspace(start, end, steps, dtype=D.f32, device=None, requires_grad=False):
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    values = [start + i * step for i in range(steps)]
    if steps > 1:
        values[-1] = float(end)
    return _leaf(tensor(values, dtype, device), requires_grad, "linspace")


def eye(n, m=None, dtype=D.f32, device=None, requires_grad=False):
    m = n if m is None else m
    t = tensor([[1.0 if i == j else 0.0 for j in range(m)] for i in range(n)] if n * m else [], dtype, device).reshape(n, m)
    return _leaf(t, requires_grad, "eye")


# ---- random ------------------------------------------------------------------------------------
_rng = _pyrandom.Random()


def manual_seed(seed):
    """Seed tallow's generator (rand, randn, sampling). Streams are reproducible per seed
    everywhere, numpy or not, because they come from Python's own Mersenne Twister."""
    _rng.seed(seed)


def rand(*shape, dtype=D.f32, device=None, requires_grad=False):
    shape = _shape_arg(shape)
    r = _rng.random
    return _leaf(tensor([r() for _ in range(numel_of(shape))], dtype, device).reshape(shape), requires_grad, "rand")


def randn(*shape, dtype=D.f32, device=None, requires_grad=False):
    shape = _shape_arg(shape)
    g = _rng.gauss
    return _leaf(tensor([g(0.0, 1.0) for _ in range(numel_of(shape))], dtype, device).reshape(shape),
                 requires_grad, "randn")


def randint(low, high, shape, dtype=D.i64, device=None):
    shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
    r = _rng.randrange
    return tensor([r(low, high) for _ in range(numel_of(shape))], dtype, device).reshape(shape)


def generator():
    """The shared random.Random used for sampling (seeded by manual_seed)."""
    return _rng


# ---- joining and picking --------------------------------------------------------------------------
def as_index(index, device, op):
    if not isinstance(index, Tensor):
        index = tensor(index, D.i64, device)
    if index.dtype not in (D.i64, D.i32, D.u32, D.u8, D.i8):
        raise DTypeError(f"{op}: the index must be an integer tensor, got {index.dtype.name}")
    if index.device is not device:
        raise DeviceError(f"{op}: the index is on {index.device}, the tensor on {device}")
    return index


def where(cond, a, b):
    """a where cond else b; a and b may be tensors or Python scalars; all broadcast together."""
    if not isinstance(cond, Tensor):
        raise DTypeError("where: the condition must be a bool tensor")
    dev = cond.device
    if cond.dtype is not D.bool_:
        cond = cond.ne(0)
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    if ta is None and tb is None:
        dtype = D.promote(D.default_for(a), D.default_for(b))
        ta, tb = full((), a, dtype, dev), full((), b, dtype, dev)
    elif ta is None:
        ta = full((), a, D.promote_scalar(tb.dtype, a), dev)
    elif tb is None:
        tb = full((), b, D.promote_scalar(ta.dtype, b), dev)
    for t in (ta, tb):
        if t.device is not dev:
            raise DeviceError(f"where: tensors are on {dev} and {t.device}")
    dtype = D.promote(ta.dtype, tb.dtype)
    ta, tb = ta.to(dtype), tb.to(dtype)
    from .layout import broadcast_shapes
    shape = broadcast_shapes(broadcast_shapes(cond.shape, ta.shape, "where"), tb.shape, "where")
    st = dev.backend.where(cond._storage, cond._layout.broadcast_to(shape), ta._storage, ta._layout.broadcast_to(shape),
                           tb._storage, tb._layout.broadcast_to(shape), dtype)
    return ta._record(_make(st, shape, dtype, dev), (None, ta, tb), lambda: G.where(cond))


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat: needs at least one tensor")
    first = tensors[0]
    dim = _dim(dim, first.ndim, "cat")
    dtype = first.dtype
    for t in tensors[1:]:
        if t.device is not first.device:
            raise DeviceError(f"cat: tensors are on {first.device} and {t.device}")
        dtype = D.promote(dtype, t.dtype)
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim):
            raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside dim {dim}")
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    be = first.device.backend
    out = _make(be.full(numel_of(shape), 0, dtype), shape, dtype, first.device)
    pos = 0
    for t in tensors:
        n = t.shape[dim]
        if n:
            src = t.to(dtype)
            be.assign(out._storage, out._layout.narrow(dim, pos, n), src._storage, src._layout, dtype)
        pos += n
    return first._record(out, tensors, lambda: G.cat(tensors, dim))


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack: needs at least one tensor")
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise ShapeError(f"stack: all shapes must be equal, got {tensors[0].shape} and {t.shape}")
    dim = _dim(dim, tensors[0].ndim + 1, "stack")
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(t, split_size, dim=0):
    dim = _dim(dim, t.ndim, "split")
    size = t.shape[dim]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise ShapeError(f"split: split_size must be positive, got {split_size}")
        sizes = [min(split_size, size - i) for i in range(0, size, split_size)] or [0]
    else:
        sizes = list(split_size)
        if sum(sizes) != size:
            raise ShapeError(f"split: sizes {sizes} do not add up to {size} (dim {dim} of shape {t.shape})")
    out, pos = [], 0
    for s in sizes:
        out.append(t.narrow(dim, pos, s))
        pos += s
    return tuple(out)


def chunk(t, chunks, dim=0):
    dim = _dim(dim, t.ndim, "chunk")
    return split(t, max(1, -(-t.shape[dim] // chunks)), dim)


def pad(t, pads, value=0.0):
    """torch-style constant padding: pads = (last_lo, last_hi, second_last_lo, ...)."""
    if len(pads) % 2 or len(pads) // 2 > t.ndim:
        raise ShapeError(f"pad: {pads} must hold (lo, hi) pairs for at most {t.ndim} dims")
    shape = list(t.shape)
    offsets = [0] * t.ndim
    for i in range(len(pads) // 2):
        d = t.ndim - 1 - i
        lo, hi = pads[2 * i], pads[2 * i + 1]
        if lo < 0 or hi < 0:
            raise ShapeError("pad: negative padding is not supported; use narrow")
        shape[d] += lo + hi
        offsets[d] = lo
    out = full(shape, value, t.dtype, t.device)
    view = out._layout
    for d in range(t.ndim):
        view = view.narrow(d, offsets[d], t.shape[d])
    if t.numel():
        t.device.backend.assign(out._storage, view, t._storage, t._layout, t.dtype)
    key = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
    return t._record(out, (t,), lambda: (lambda g: (g[key],)))
