"""Making tensors: from Python values, numpy arrays or raw bytes, filled, ranges, random.

Ops that compute from existing tensors (cat, where, pad, ...) are in the op front end (ops/)."""
from __future__ import annotations

import math
import random as _pyrandom
from collections.abc import Sequence

from . import dtypes as D
from .device import Device, default_device
from .errors import DTypeError, FormatError, ShapeError
from .layout import Layout, numel_of
from .nested import coerce, flatten_nested, infer_dtype
from .ops import cat  # noqa: F401  (models/attention.py imports cat from here; drop when the models move)
from .tensor import Number, Tensor

DTypeLike = D.DType | str | None
DeviceLike = Device | str | None


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


def tensor(data: object, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
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
    flat, shape = flatten_nested(data)
    dtype = dtype or infer_dtype(flat)
    if dtype.is_quantized:
        return _tensor(data, D.f32, dev).to(dtype)
    return _make(dev.backend.from_list(coerce(flat, dtype, "tensor"), dtype), shape, dtype, dev)


def from_numpy(array: object, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
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
    buf = memoryview(data.view(np.uint8))  # type: ignore[arg-type]  # ndarray has the buffer protocol
    return _leaf(from_buffer(buf, dtype, array.shape, device), requires_grad, "from_numpy")


def from_buffer(data: object, dtype: D.DType | str, shape: Sequence[int], device: DeviceLike = None) -> Tensor:
    """A tensor over raw little-endian bytes (quantised dtypes: the GGUF blocks)."""
    dt = D.get_dtype(dtype)
    dims = tuple(int(s) for s in shape)
    numel = numel_of(dims)
    if dt.is_quantized and (not dims or dims[-1] % dt.block_size):
        raise ShapeError(f"from_buffer: a {dt.name} tensor's last dim must be a multiple of {dt.block_size}, "
                         f"got shape {dims}")
    expected = dt.nbytes(numel)
    got = memoryview(data).nbytes  # type: ignore[arg-type]  # any buffer-protocol object
    if got != expected:
        raise FormatError(f"from_buffer: {got} bytes given for a {dt.name} tensor of shape {dims}, "
                          f"which needs {expected}")
    dev = _device(device)
    return _make(dev.backend.from_bytes(data, dt), dims, dt, dev)


def full(shape: int | Sequence[int], value: Number, dtype: DTypeLike = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    dims = _shape_arg((shape,))
    dt = D.get_dtype(dtype) or D.default_for(value)
    if dt.is_int:
        D.check_ints_fit([value], dt, "full")
    dev = _device(device)
    return _leaf(_make(dev.backend.full(numel_of(dims), value, dt), dims, dt, dev), requires_grad, "full")


def zeros(*shape: int | Sequence[int], dtype: DTypeLike = D.f32, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    return _leaf(full(_shape_arg(shape), 0, dtype, device), requires_grad, "zeros")


def empty(*shape: int | Sequence[int], dtype: DTypeLike = D.f32, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    """torch.empty's spelling; tallow fills it with zeros (no uninitialised memory)."""
    return _leaf(full(_shape_arg(shape), 0, dtype, device), requires_grad, "empty")


def ones(*shape: int | Sequence[int], dtype: DTypeLike = D.f32, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    return _leaf(full(_shape_arg(shape), 1, dtype, device), requires_grad, "ones")


def zeros_like(t: Tensor, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    return _leaf(full(t.shape, 0, dtype or t.dtype, device or t.device), requires_grad, "zeros_like")


def ones_like(t: Tensor, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    return _leaf(full(t.shape, 1, dtype or t.dtype, device or t.device), requires_grad, "ones_like")


def full_like(t: Tensor, value: Number, dtype: DTypeLike = None, device: DeviceLike = None,
              requires_grad: bool = False) -> Tensor:
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


def arange(start: Number, end: Number | None = None, step: Number = 1, dtype: DTypeLike = None,
           device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, math.ceil((end - start) / step))
    dtype = D.get_dtype(dtype) or (D.f32 if any(isinstance(v, float) for v in (start, end, step)) else D.i64)
    dev = _device(device)
    return _leaf(_make(dev.backend.arange(start, step, n, dtype), (n,), dtype, dev), requires_grad, "arange")


def linspace(start: float, end: float, steps: int, dtype: DTypeLike = D.f32, device: DeviceLike = None,
             requires_grad: bool = False) -> Tensor:
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    values = [start + i * step for i in range(steps)]
    if steps > 1:
        values[-1] = float(end)
    return _leaf(tensor(values, dtype, device), requires_grad, "linspace")


def eye(n: int, m: int | None = None, dtype: DTypeLike = D.f32, device: DeviceLike = None,
        requires_grad: bool = False) -> Tensor:
    m = n if m is None else m
    t = tensor([[1.0 if i == j else 0.0 for j in range(m)] for i in range(n)] if n * m else [],
               dtype, device).reshape(n, m)
    return _leaf(t, requires_grad, "eye")


# ---- random ------------------------------------------------------------------------------------
_rng = _pyrandom.Random()


def manual_seed(seed: int) -> None:
    """Seed tallow's generator (rand, randn, sampling). Streams are reproducible per seed
    everywhere, numpy or not, because they come from Python's own Mersenne Twister."""
    _rng.seed(seed)


def rand(*shape: int | Sequence[int], dtype: DTypeLike = D.f32, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    dims = _shape_arg(shape)
    r = _rng.random
    return _leaf(tensor([r() for _ in range(numel_of(dims))], dtype, device).reshape(dims), requires_grad, "rand")


def randn(*shape: int | Sequence[int], dtype: DTypeLike = D.f32, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    dims = _shape_arg(shape)
    g = _rng.gauss
    return _leaf(tensor([g(0.0, 1.0) for _ in range(numel_of(dims))], dtype, device).reshape(dims),
                 requires_grad, "randn")


def randint(low: int, high: int, shape: int | Sequence[int], dtype: DTypeLike = D.i64,
            device: DeviceLike = None) -> Tensor:
    shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
    r = _rng.randrange
    return tensor([r(low, high) for _ in range(numel_of(shape))], dtype, device).reshape(shape)


def generator() -> _pyrandom.Random:
    """The shared random.Random used for sampling (seeded by manual_seed)."""
    return _rng
