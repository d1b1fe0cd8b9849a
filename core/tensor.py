"""Tensor: dtype + device + Layout over backend storage.

Every op method is one line that calls the op front end (tallow.ops), which checks
arguments, promotes dtypes, records gradients and calls one backend primitive.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence  # not typing: `import tallow` stays light

from . import dtypes as D
from . import indexing, ops
from .autograd import backward
from .device import Device
from .errors import DTypeError, ShapeError
from .layout import Layout
from .nested import nest
from .tensor_base import TensorBase

Number = int | float | bool
Dims = int | Sequence[int] | None


class Tensor(TensorBase):
    __slots__ = ("_storage", "_layout", "dtype", "device", "requires_grad", "grad", "_node", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, storage, layout: Layout, dtype: D.DType, device: Device):
        self._storage = storage
        self._layout = layout
        self.dtype = dtype
        self.device = device
        self.requires_grad = False
        self.grad = None
        self._node = None  # (backward, inputs) when an op recorded this tensor

    def _new(self, storage, shape, dtype=None) -> Tensor:
        """A contiguous tensor over new storage on this tensor's device (how ops make results)."""
        return Tensor(storage, Layout(shape), dtype or self.dtype, self.device)

    def _view(self, layout: Layout) -> Tensor:
        """Another view of this tensor's storage."""
        return Tensor(self._storage, layout, self.dtype, self.device)

    def _on_device(self, storage, layout: Layout, device: Device) -> Tensor:
        """This tensor's values, copied into storage on another device."""
        return Tensor(storage, layout, self.dtype, device)

    # ---- autograd -------------------------------------------------------------
    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and not self.dtype.is_float:
            raise DTypeError(f"only float tensors can require grad, this one is {self.dtype.name}")
        self.requires_grad = flag
        return self

    def backward(self, grad: Tensor | None = None) -> None:
        backward(self, grad)

    def detach(self) -> Tensor:
        return Tensor(self._storage, self._layout, self.dtype, self.device)

    # ---- attributes -----------------------------------------------------------
    shape = property(lambda self: self._layout.shape)
    strides = property(lambda self: self._layout.strides)
    ndim = property(lambda self: len(self._layout.shape))
    T = property(lambda self: ops.t(self))

    def numel(self) -> int:
        return self._layout.numel()

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[ops.dim_index(dim, self.ndim, "size")]

    def is_contiguous(self) -> bool:
        return self._layout.is_contiguous()

    def __len__(self) -> int:
        if not self.shape:
            raise ShapeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        body = self.tolist() if self.numel() <= 64 and not self.dtype.is_quantized else f"<{self.numel()} elements>"
        return f"tensor({body}, shape={self.shape}, dtype={self.dtype.name}, device={self.device})"

    # ---- conversion -----------------------------------------------------------
    def tolist(self) -> list | Number:
        if self.dtype.is_quantized:
            return self.to(D.f32).tolist()
        flat = self.device.backend.to_list(self._storage, self._layout, self.dtype)
        if self.dtype is D.bool_:
            flat = [bool(v) for v in flat]
        return nest(flat, self.shape)

    def item(self) -> Number:
        if self.numel() != 1:
            raise ShapeError(f"item() needs exactly one element, the tensor has shape {self.shape}")
        value = self.device.backend.to_list(self._storage, self._layout, self.dtype)[0]
        return bool(value) if self.dtype is D.bool_ else value

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __bytes__(self) -> bytes:
        return self.device.backend.to_bytes(self._storage, self._layout, self.dtype)

    def numpy(self):
        """A numpy array (a copy). bf16 comes back as float32 (numpy has no bf16)."""
        if self.dtype.is_quantized:
            return self.to(D.f32).numpy()
        return self.device.backend.to_numpy(self._storage, self._layout, self.dtype)

    def to(self, target: Device | D.DType | str | None = None, dtype: D.DType | str | None = None) -> Tensor:
        """Move to a device and/or convert to a dtype: t.to("wgpu"), t.to(tallow.f16)."""
        if target is self.dtype and dtype is None:  # the op front end's x.to(dtype) it already has
            return self
        t = self
        if target is not None:
            device, target_dtype = ops.parse_target(target)
            if target_dtype is not None:
                dtype = target_dtype
            else:
                t = ops.to_device(self, device)
        dtype = D.get_dtype(dtype)
        return t if dtype is None else ops.cast(t, dtype)

    def float(self) -> Tensor: return ops.cast(self, D.f32)
    def half(self) -> Tensor: return ops.cast(self, D.f16)
    def contiguous(self) -> Tensor: return ops.contiguous(self)
    def clone(self) -> Tensor: return ops.clone(self)

    def new_full(self, shape: Sequence[int], value: Number, dtype: D.DType | str | None = None) -> Tensor:
        """A tensor of `shape` filled with value, on this device, of this dtype unless given."""
        return ops.new_full(self, shape, value, dtype)

    def new_zeros(self, shape: Sequence[int], dtype: D.DType | str | None = None) -> Tensor:
        return ops.new_full(self, shape, 0, dtype)

    # ---- views ------------------------------------------------------------------
    def reshape(self, *shape: int | Sequence[int]) -> Tensor: return ops.reshape(self, shape)
    view = reshape
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor: return ops.flatten(self, start_dim, end_dim)
    def permute(self, *dims: int | Sequence[int]) -> Tensor: return ops.permute(self, dims)
    def transpose(self, d0: int = -2, d1: int = -1) -> Tensor: return ops.transpose(self, d0, d1)
    def t(self) -> Tensor: return ops.t(self)
    def narrow(self, dim: int, start: int, length: int) -> Tensor: return ops.narrow(self, dim, start, length)
    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor: return ops.squeeze(self, dim)
    def unsqueeze(self, dim: int) -> Tensor: return ops.unsqueeze(self, dim)
    def expand(self, *shape: int | Sequence[int]) -> Tensor: return ops.expand(self, shape)
    def broadcast_to(self, shape: Sequence[int]) -> Tensor: return ops.expand(self, tuple(shape))
    def split(self, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        return ops.split(self, split_size, dim)
    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]: return ops.chunk(self, chunks, dim)

    def __getitem__(self, key) -> Tensor: return indexing.getitem(self, key)
    def __setitem__(self, key, value: Operand) -> None: indexing.setitem(self, key, value)

    def __iter__(self) -> Iterator[Tensor]:
        for i in range(len(self)):
            yield self[i]

    # ---- element-wise (ops.UNARY lists the unary ops and their gradients) ---------------------
    def neg(self) -> Tensor: return ops.unary(self, "neg")
    def abs(self) -> Tensor: return ops.unary(self, "abs")
    def exp(self) -> Tensor: return ops.unary(self, "exp")
    def expm1(self) -> Tensor: return ops.unary(self, "expm1")
    def log(self) -> Tensor: return ops.unary(self, "log")
    def sqrt(self) -> Tensor: return ops.unary(self, "sqrt")
    def rsqrt(self) -> Tensor: return ops.unary(self, "rsqrt")
    def sin(self) -> Tensor: return ops.unary(self, "sin")
    def cos(self) -> Tensor: return ops.unary(self, "cos")
    def tanh(self) -> Tensor: return ops.unary(self, "tanh")
    def sigmoid(self) -> Tensor: return ops.unary(self, "sigmoid")
    def relu(self) -> Tensor: return ops.unary(self, "relu")
    def silu(self) -> Tensor: return ops.unary(self, "silu")
    def square(self) -> Tensor: return ops.unary(self, "square")
    def reciprocal(self) -> Tensor: return ops.unary(self, "reciprocal")
    def floor(self) -> Tensor: return ops.unary(self, "floor")
    def ceil(self) -> Tensor: return ops.unary(self, "ceil")
    def round(self) -> Tensor: return ops.unary(self, "round")
    def sign(self) -> Tensor: return ops.unary(self, "sign")
    def logical_not(self) -> Tensor: return ops.unary(self, "logical_not")

    def gelu(self, approximate: str = "none") -> Tensor:
        """GELU; approximate="none" is the erf form, "tanh" the tanh approximation."""
        return ops.gelu(self, approximate)

    def clamp(self, min: Number | None = None, max: Number | None = None) -> Tensor:
        return ops.unary(self, "clamp", (min, max))

    clip = clamp

    def affine(self, mul: Number, add: Number) -> Tensor:
        """self * mul + add in one op (Candle's affine)."""
        return ops.unary(self, "affine", (mul, add))

    def __neg__(self) -> Tensor: return ops.unary(self, "neg")
    def __abs__(self) -> Tensor: return ops.unary(self, "abs")
    def __invert__(self) -> Tensor: return ops.unary(self, "logical_not")

    def add(self, o: Operand) -> Tensor: return ops.binary(self, o, "add")
    def sub(self, o: Operand) -> Tensor: return ops.binary(self, o, "sub")
    def mul(self, o: Operand) -> Tensor: return ops.binary(self, o, "mul")
    def div(self, o: Operand) -> Tensor: return ops.binary(self, o, "div")
    def maximum(self, o: Operand) -> Tensor: return ops.binary(self, o, "maximum")
    def minimum(self, o: Operand) -> Tensor: return ops.binary(self, o, "minimum")
    def eq(self, o: Operand) -> Tensor: return ops.binary(self, o, "eq")
    def ne(self, o: Operand) -> Tensor: return ops.binary(self, o, "ne")
    def lt(self, o: Operand) -> Tensor: return ops.binary(self, o, "lt")
    def le(self, o: Operand) -> Tensor: return ops.binary(self, o, "le")
    def gt(self, o: Operand) -> Tensor: return ops.binary(self, o, "gt")
    def ge(self, o: Operand) -> Tensor: return ops.binary(self, o, "ge")

    __add__ = add
    __sub__ = sub
    __mul__ = mul
    __truediv__ = div
    __eq__ = eq  # type: ignore[assignment]  # element-wise, as in numpy and torch
    __ne__ = ne  # type: ignore[assignment]
    __lt__ = lt
    __le__ = le
    __gt__ = gt
    __ge__ = ge
    __hash__ = object.__hash__

    def __radd__(self, o: Operand) -> Tensor: return ops.binary(self, o, "add", reverse=True)
    def __rsub__(self, o: Operand) -> Tensor: return ops.binary(self, o, "sub", reverse=True)
    def __rmul__(self, o: Operand) -> Tensor: return ops.binary(self, o, "mul", reverse=True)
    def __rtruediv__(self, o: Operand) -> Tensor: return ops.binary(self, o, "div", reverse=True)
    def __rpow__(self, o: Operand) -> Tensor: return ops.binary(self, o, "pow", reverse=True)

    def pow(self, exponent: Operand) -> Tensor: return ops.pow(self, exponent)
    __pow__ = pow

    def __and__(self, o: Operand) -> Tensor: return ops.logical(self, o, "mul")
    def __or__(self, o: Operand) -> Tensor: return ops.logical(self, o, "maximum")

    def where(self, cond: Tensor, other: Operand) -> Tensor:
        """torch-style x.where(cond, y): x where cond else y."""
        return ops.where(cond, self, other)

    def masked_fill(self, mask: Tensor, value: Operand) -> Tensor: return ops.where(mask, value, self)

    # ---- reductions ----------------------------------------------------------------
    def sum(self, dim: Dims = None, keepdim: bool = False) -> Tensor: return ops.reduce(self, "sum", dim, keepdim)
    def prod(self, dim: Dims = None, keepdim: bool = False) -> Tensor: return ops.reduce(self, "prod", dim, keepdim)
    def max(self, dim: Dims = None, keepdim: bool = False) -> Tensor: return ops.reduce(self, "max", dim, keepdim)
    def min(self, dim: Dims = None, keepdim: bool = False) -> Tensor: return ops.reduce(self, "min", dim, keepdim)
    def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return ops.arg_reduce(self, "argmax", dim, keepdim)
    def argmin(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return ops.arg_reduce(self, "argmin", dim, keepdim)
    def mean(self, dim: Dims = None, keepdim: bool = False) -> Tensor: return ops.mean(self, dim, keepdim)

    def var(self, dim: Dims = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return ops.var(self, dim, keepdim, correction)

    def std(self, dim: Dims = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return ops.var(self, dim, keepdim, correction).sqrt()

    def cumsum(self, dim: int) -> Tensor: return ops.cumsum(self, dim)
    def softmax(self, dim: int = -1) -> Tensor: return ops.softmax(self, dim)
    def log_softmax(self, dim: int = -1) -> Tensor: return ops.softmax(self, dim, log=True)

    # ---- linear algebra and indexing ops -------------------------------------------------------
    def matmul(self, other: Tensor) -> Tensor: return ops.matmul(self, other)
    __matmul__ = matmul

    def __rmatmul__(self, other):
        return NotImplemented

    def index_select(self, dim: int, index: Tensor | Sequence[int]) -> Tensor: return ops.index_select(self, dim, index)
    def gather(self, dim: int, index: Tensor | Sequence) -> Tensor: return ops.gather(self, dim, index)

    def scatter_add(self, dim: int, index: Tensor | Sequence, src: Tensor) -> Tensor:
        return ops.scatter_add(self, dim, index, src)


Operand = Tensor | int | float | bool  # a tensor, or a Python number broadcast against it
