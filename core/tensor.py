"""Tensor: dtype + device + Layout over backend storage.

Views change only the Layout; every computing op checks shapes and dtypes
here, then calls one backend primitive (core/backends/base.py).
"""
import math

from . import dtypes as D
from . import grad_rules as G
from .autograd import _Mode, record
from .device import Device
from .errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from .index_check import check_ids
from .layout import Layout, broadcast_shapes, numel_of

# Unary ops that need a float input: integer/bool tensors are promoted to f32 first (as in torch).
_FLOAT_UNARY = frozenset("exp log sqrt rsqrt sin cos tanh sigmoid gelu gelu_tanh silu reciprocal".split())


def _dim(d, ndim, op):
    if 0 <= d < ndim:
        return d
    if not -ndim <= d < max(ndim, 1):
        raise ShapeError(f"{op}: dim {d} is out of range for a tensor with {ndim} dims")
    return d % ndim if ndim else 0


def _same_device(op, a, b):
    if a.device is not b.device:
        raise DeviceError(f"{op}: tensors are on different devices ({a.device} and {b.device}); move one with .to()")


class Tensor:
    __slots__ = ("_storage", "_layout", "dtype", "device", "requires_grad", "grad", "_node", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, storage, layout, dtype, device):
        self._storage = storage
        self._layout = layout
        self.dtype = dtype
        self.device = device
        self.requires_grad = False
        self.grad = None
        self._node = None  # (backward, inputs) when an op recorded this tensor

    # ---- autograd -------------------------------------------------------------
    def requires_grad_(self, flag=True):
        if flag and not self.dtype.is_float:
            raise DTypeError(f"only float tensors can require grad, this one is {self.dtype.name}")
        self.requires_grad = flag
        return self

    def backward(self, grad=None):
        from .autograd import backward
        backward(self, grad)

    def detach(self):
        return Tensor(self._storage, self._layout, self.dtype, self.device)

    def _record(self, out, inputs, rule):
        """Attach a backward rule to out when grad mode is on and an input requires grad."""
        if _Mode.enabled:
            for t in inputs:
                if t is not None and t.requires_grad:
                    return record(out, inputs, rule())
        return out

    def _new(self, storage, shape, dtype=None):
        return Tensor(storage, Layout(shape), dtype or self.dtype, self.device)

    def _view(self, layout):
        return Tensor(self._storage, layout, self.dtype, self.device)

    # ---- attributes -----------------------------------------------------------
    shape = property(lambda self: self._layout.shape)
    strides = property(lambda self: self._layout.strides)
    ndim = property(lambda self: len(self._layout.shape))
    T = property(lambda self: self.t())

    def numel(self):
        return self._layout.numel()

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[_dim(dim, self.ndim, "size")]

    def is_contiguous(self):
        return self._layout.is_contiguous()

    def __len__(self):
        if not self.shape:
            raise ShapeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        body = self.tolist() if self.numel() <= 64 and not self.dtype.is_quantized else f"<{self.numel()} elements>"
        return f"tensor({body}, shape={self.shape}, dtype={self.dtype.name}, device={self.device})"

    # ---- conversion -----------------------------------------------------------
    def tolist(self):
        if self.dtype.is_quantized:
            return self.to(D.f32).tolist()
        flat = self.device.backend.to_list(self._storage, self._layout, self.dtype)
        if self.dtype is D.bool_:
            flat = [bool(v) for v in flat]
        return _nest(flat, self.shape)

    def item(self):
        if self.numel() != 1:
            raise ShapeError(f"item() needs exactly one element, the tensor has shape {self.shape}")
        value = self.device.backend.to_list(self._storage, self._layout, self.dtype)[0]
        return bool(value) if self.dtype is D.bool_ else value

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __bytes__(self):
        return self.device.backend.to_bytes(self._storage, self._layout, self.dtype)

    def numpy(self):
        """A numpy array (a copy). bf16 comes back as float32 (numpy has no bf16)."""
        if self.dtype.is_quantized:
            return self.to(D.f32).numpy()
        return self.device.backend.to_numpy(self._storage, self._layout, self.dtype)

    def to(self, target=None, dtype=None):
        """Move to a device and/or convert to a dtype: t.to("wgpu"), t.to(tallow.f16)."""
        if target is not None:
            try:
                dtype_from_target = D.get_dtype(target) if not isinstance(target, Device) else None
            except DTypeError:
                dtype_from_target = None
            if dtype_from_target is not None:
                dtype = dtype_from_target
            else:
                device = Device(target)
                t = self
                if device is not self.device:
                    data = bytes(self)
                    t = Tensor(device.backend.from_bytes(data, self.dtype), Layout(self.shape) if not self.dtype.is_quantized else self._layout, self.dtype, device)
                    src = self.device
                    t = self._record(t, (self,), lambda: (lambda g: (g.to(src),)))
                return t if dtype is None else t.to(dtype=dtype)
        dtype = D.get_dtype(dtype)
        if dtype is None or dtype is self.dtype:
            return self
        be = self.device.backend
        if self.dtype.is_quantized:
            w = self._base_quant("to")
            st = be.dequantize(w._storage, w.dtype, w.numel(), dtype)
            return Tensor(st, Layout(w.shape), dtype, self.device)._view(self._layout)
        if dtype.is_quantized:
            from .quant import quantize
            return quantize(self, dtype)
        out = self._new(be.cast(self._storage, self._layout, self.dtype, dtype), self.shape, dtype)
        return self._record(out, (self,), lambda: G.cast(self.dtype)) if dtype.is_float else out

    def float(self):
        return self.to(D.f32)

    def half(self):
        return self.to(D.f16)

    def contiguous(self):
        if self._layout.is_contiguous() and self._layout.offset == 0:
            return self
        if self.dtype.is_quantized:
            raise UnsupportedError("a quantised tensor cannot be copied into a new layout; dequantise it first with .to(tallow.f32)")
        return self.clone()

    def clone(self):
        out = self._new(self.device.backend.copy(self._storage, self._layout, self.dtype), self.shape)
        return self._record(out, (self,), lambda: (lambda g: (g,)))

    def _base_quant(self, op):
        """The contiguous (rows, k) quantised tensor under this view."""
        lay = self._layout
        if lay.offset == 0 and lay.is_contiguous():
            return self
        if len(lay.shape) == 2 and lay.offset == 0 and lay.strides == (1, lay.shape[0]):
            return Tensor(self._storage, Layout((lay.shape[1], lay.shape[0])), self.dtype, self.device)
        raise UnsupportedError(f"{op}: a quantised tensor can be used whole or transposed, not as a strided view")

    # ---- views ------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        lay = self._layout
        if lay._contiguous and lay.offset == 0 and -1 not in shape and numel_of(shape) == numel_of(lay.shape) \
                and all(type(s) is int and s >= 0 for s in shape):
            out = Tensor(self._storage, Layout(shape), self.dtype, self.device)  # fast path: a plain view
            if self.requires_grad and _Mode.enabled:
                old = lay.shape
                record(out, (self,), lambda g: (g.reshape(old),))
            return out
        shape = _infer_shape(shape, self.numel(), self.shape)
        lay = self._layout.reshaped(shape)
        if lay is None:
            if self.dtype.is_quantized:
                raise UnsupportedError("reshape of a strided quantised view")
            return self.contiguous().reshape(shape)
        old = self.shape
        return self._record(self._view(lay), (self,), lambda: (lambda g: (g.reshape(old),)))

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _dim(start_dim, self.ndim, "flatten"), _dim(end_dim, self.ndim, "flatten")
        shape = self.shape[:s] + (numel_of(self.shape[s:e + 1]),) + self.shape[e + 1:]
        return self.reshape(shape)

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        dims = tuple(_dim(d, self.ndim, "permute") for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"permute: {dims} is not a permutation of the {self.ndim} dims of shape {self.shape}")
        inverse = tuple(dims.index(i) for i in range(len(dims)))
        return self._record(self._view(self._layout.permute(dims)), (self,), lambda: (lambda g: (g.permute(inverse),)))

    def transpose(self, d0=-2, d1=-1):
        lay = self._layout
        n = len(lay.shape)
        if n < 2 and d0 in (-2, 0) and d1 in (-1, 0):
            return self
        d0, d1 = _dim(d0, n, "transpose"), _dim(d1, n, "transpose")
        shape, strides = list(lay.shape), list(lay.strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        out = Tensor(self._storage, Layout(shape, strides, lay.offset), self.dtype, self.device)
        if self.requires_grad and _Mode.enabled:
            record(out, (self,), lambda g: (g.transpose(d0, d1),))
        return out

    def t(self):
        n = len(self._layout.shape)
        if n > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dims, got shape {self.shape}; use transpose(d0, d1)")
        return self.transpose(0, 1) if n == 2 else self

    def narrow(self, dim, start, length):
        dim = _dim(dim, self.ndim, "narrow")
        size = self.shape[dim]
        if start < 0:
            start += size
        if not (0 <= start and length >= 0 and start + length <= size):
            raise ShapeError(f"narrow: [{start}, {start + length}) is outside dim {dim} of size {size} (shape {self.shape})")
        out = self._view(self._layout.narrow(dim, start, length))
        return self._record(out, (self,), lambda: G.view_into(self.shape, (slice(None),) * dim + (slice(start, start + length),)))

    def squeeze(self, dim=None):
        lay = self._layout
        if dim is None:
            keep = [i for i, s in enumerate(lay.shape) if s != 1]
        else:
            dims = {_dim(d, self.ndim, "squeeze") for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
            keep = [i for i, s in enumerate(lay.shape) if not (i in dims and s == 1)]
        out = self._view(Layout([lay.shape[i] for i in keep], [lay.strides[i] for i in keep], lay.offset))
        return self._record(out, (self,), lambda: (lambda g: (g.reshape(lay.shape),)))

    def unsqueeze(self, dim):
        dim = _dim(dim, self.ndim + 1, "unsqueeze")
        lay = self._layout
        stride = lay.strides[dim] * lay.shape[dim] if dim < self.ndim else 1
        out = self._view(Layout(lay.shape[:dim] + (1,) + lay.shape[dim:], lay.strides[:dim] + (stride,) + lay.strides[dim:], lay.offset))
        return self._record(out, (self,), lambda: (lambda g: (g.reshape(lay.shape),)))

    def expand(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        extra = len(shape) - self.ndim
        shape = tuple(self.shape[i - extra] if s == -1 else s for i, s in enumerate(shape))
        return self._record(self._view(self._layout.broadcast_to(shape, "expand")), (self,), lambda: (lambda g: (g,)))

    def broadcast_to(self, shape):
        return self.expand(tuple(shape))

    def __getitem__(self, key):
        from .indexing import getitem
        return getitem(self, key)

    def __setitem__(self, key, value):
        from .indexing import setitem
        setitem(self, key, value)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # ---- element-wise -------------------------------------------------------------
    def _unary(self, op, arg=None):
        t = self if self.dtype.is_float or op not in _FLOAT_UNARY else self.to(D.f32)
        out_dtype = D.bool_ if op == "logical_not" else t.dtype
        out = t._new(t.device.backend.unary(op, t._storage, t._layout, t.dtype, arg), t.shape, out_dtype)
        if t.requires_grad and _Mode.enabled:
            record(out, (t,), G.unary(op, t, out, arg))
        return out

    def neg(self): return self._unary("neg")
    def abs(self): return self._unary("abs")
    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def sqrt(self): return self._unary("sqrt")
    def rsqrt(self): return self._unary("rsqrt")
    def sin(self): return self._unary("sin")
    def cos(self): return self._unary("cos")
    def tanh(self): return self._unary("tanh")
    def sigmoid(self): return self._unary("sigmoid")
    def relu(self): return self._unary("relu")
    def silu(self): return self._unary("silu")
    def square(self): return self._unary("square")
    def reciprocal(self): return self._unary("reciprocal")
    def floor(self): return self._unary("floor")
    def ceil(self): return self._unary("ceil")
    def round(self): return self._unary("round")
    def sign(self): return self._unary("sign")
    def logical_not(self): return self._unary("logical_not")

    def gelu(self, approximate="none"):
        """GELU; approximate="none" is the erf form, "tanh" the tanh approximation."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._unary("gelu" if approximate == "none" else "gelu_tanh")

    def clamp(self, min=None, max=None):
        return self._unary("clamp", (min, max))

    clip = clamp

    def affine(self, mul, add):
        """self * mul + add in one op (Candle's affine)."""
        return self._unary("affine", (mul, add))

    def __neg__(self): return self.neg()
    def __abs__(self): return self.abs()
    def __invert__(self): return self.logical_not()

    def _operand(self, other, op):
        if isinstance(other, Tensor):
            _same_device(op, self, other)
            return other, D.promote(self.dtype, other.dtype)
        if not isinstance(other, (int, float, bool)):
            try:
                other = float(other) if not isinstance(other, (list, tuple)) else other
            except TypeError:
                return None, None
            if isinstance(other, (list, tuple)):
                from .creation import tensor
                other = tensor(other, device=self.device)
                return other, D.promote(self.dtype, other.dtype)
        dtype = D.promote_scalar(self.dtype, other)
        be = self.device.backend
        return Tensor(be.full(1, other, dtype), Layout(()), dtype, self.device), dtype

    def _binary(self, other, op, reverse=False, cmp=False):
        if not cmp and type(other) is Tensor and other.dtype is self.dtype and other._layout.shape == self._layout.shape \
                and other.device is self.device and (op != "div" or self.dtype.kind == "f"):
            # Fast path (same dtype, same shape): nothing to promote or broadcast.
            a, b = (other, self) if reverse else (self, other)
            st = self.device.backend.binary(op, a._storage, a._layout, b._storage, b._layout, self.dtype)
            out = Tensor(st, Layout(self._layout.shape), self.dtype, self.device)
            if (a.requires_grad or b.requires_grad) and _Mode.enabled:
                record(out, (a, b), G.binary(op, a, b, out))
            return out
        b, dtype = self._operand(other, op)
        if b is None:
            return NotImplemented
        a = self
        if reverse:
            a, b = b, a
        if op == "div" and not dtype.is_float:
            dtype = D.f32
        if a.dtype is not dtype:
            a = a.to(dtype)
        if b.dtype is not dtype:
            b = b.to(dtype)
        shape = broadcast_shapes(a.shape, b.shape, op)
        la = a._layout if a.shape == shape else a._layout.broadcast_to(shape, op)
        lb = b._layout if b.shape == shape else b._layout.broadcast_to(shape, op)
        be = self.device.backend
        if cmp:
            return Tensor(be.compare(op, a._storage, la, b._storage, lb, dtype), Layout(shape), D.bool_, self.device)
        out = Tensor(be.binary(op, a._storage, la, b._storage, lb, dtype), Layout(shape), dtype, self.device)
        return self._record(out, (a, b), lambda: G.binary(op, a, b, out))

    def add(self, o, _op="add"): return self._binary(o, _op)
    def sub(self, o, _op="sub"): return self._binary(o, _op)
    def mul(self, o, _op="mul"): return self._binary(o, _op)
    def div(self, o, _op="div"): return self._binary(o, _op)
    def maximum(self, o): return self._binary(o, "maximum")
    def minimum(self, o): return self._binary(o, "minimum")
    def eq(self, o): return self._binary(o, "eq", cmp=True)
    def ne(self, o): return self._binary(o, "ne", cmp=True)
    def lt(self, o): return self._binary(o, "lt", cmp=True)
    def le(self, o): return self._binary(o, "le", cmp=True)
    def gt(self, o): return self._binary(o, "gt", cmp=True)
    def ge(self, o): return self._binary(o, "ge", cmp=True)

    __add__ = add
    __sub__ = sub
    __mul__ = mul
    __truediv__ = div
    __eq__ = eq
    __ne__ = ne
    __lt__ = lt
    __le__ = le
    __gt__ = gt
    __ge__ = ge
    __hash__ = object.__hash__

    def __radd__(self, o): return self._binary(o, "add", reverse=True)
    def __rsub__(self, o): return self._binary(o, "sub", reverse=True)
    def __rmul__(self, o): return self._binary(o, "mul", reverse=True)
    def __rtruediv__(self, o): return self._binary(o, "div", reverse=True)
    def __rpow__(self, o): return self._binary(o, "pow", reverse=True)

    def pow(self, exponent):
        if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
            t = self if self.dtype.is_float or (isinstance(exponent, int) and exponent >= 0) else self.to(D.f32)
            if isinstance(exponent, float) and not t.dtype.is_float:
                t = t.to(D.f32)
            if exponent == 2:
                return t.square()
            return t._unary("pow_scalar", exponent)
        return self._binary(exponent, "pow")

    __pow__ = pow

    def __and__(self, o): return self._logical(o, "mul")
    def __or__(self, o): return self._logical(o, "maximum")

    def _logical(self, o, op):
        if self.dtype is not D.bool_ or (isinstance(o, Tensor) and o.dtype is not D.bool_):
            raise DTypeError("& and | are defined on bool tensors")
        return self._binary(o, op)

    def where(self, cond, other):
        """torch-style x.where(cond, y): x where cond else y."""
        from .creation import where
        return where(cond, self, other)

    def masked_fill(self, mask, value):
        from .creation import where
        return where(mask, value, self)

    # ---- reductions ----------------------------------------------------------------
    def _dims(self, dim, op):
        if dim is None:
            return tuple(range(self.ndim))
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        return tuple(sorted({_dim(d, self.ndim, op) for d in dims}))

    def _reduce(self, op, dim, keepdim):
        dims = self._dims(dim, op)
        if self.ndim == 0:
            dims = ()
        st = self.device.backend.reduce(op, self._storage, self._layout, self.dtype, dims)
        out = D.i64 if op in ("argmax", "argmin") or (op in ("sum", "prod") and self.dtype.kind in "iub") else self.dtype
        shape = tuple(1 if i in dims else s for i, s in enumerate(self.shape)) if keepdim else tuple(s for i, s in enumerate(self.shape) if i not in dims)
        res = self._new(st, shape, out)
        return self._record(res, (self,), lambda: G.reduce(op, self, res, dims, keepdim)) if out.is_float else res

    def sum(self, dim=None, keepdim=False): return self._reduce("sum", dim, keepdim)
    def prod(self, dim=None, keepdim=False): return self._reduce("prod", dim, keepdim)
    def max(self, dim=None, keepdim=False): return self._reduce("max", dim, keepdim)
    def min(self, dim=None, keepdim=False): return self._reduce("min", dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        t = self if dim is not None else self.reshape(-1)
        return t._reduce("argmax", 0 if dim is None else dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        t = self if dim is not None else self.reshape(-1)
        return t._reduce("argmin", 0 if dim is None else dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        t = self if self.dtype.is_float else self.to(D.f32)
        n = numel_of([self.shape[d] for d in self._dims(dim, "mean")])
        return t.sum(dim, keepdim) * (1.0 / n if n else math.nan)

    def var(self, dim=None, keepdim=False, correction=1):
        t = self if self.dtype.is_float else self.to(D.f32)
        n = numel_of([self.shape[d] for d in self._dims(dim, "var")])
        centred = t - t.mean(dim, keepdim=True)
        denom = n - correction
        return centred.square().sum(dim, keepdim) * (1.0 / denom if denom > 0 else math.nan)

    def std(self, dim=None, keepdim=False, correction=1):
        return self.var(dim, keepdim, correction).sqrt()

    def cumsum(self, dim):
        dim = _dim(dim, self.ndim, "cumsum")
        out = D.i64 if self.dtype.kind in "iub" else self.dtype
        res = self._new(self.device.backend.cumsum(self._storage, self._layout, self.dtype, dim), self.shape, out)
        return self._record(res, (self,), lambda: G.cumsum(dim))

    # ---- linear algebra -------------------------------------------------------------------
    def matmul(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        _same_device("matmul", self, other)
        if other.dtype.is_quantized:
            return _quantized_matmul(self, other)
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"matmul: both operands need at least 1 dim, got shapes {a.shape} and {b.shape}")
        if b.ndim == 2 and a.ndim > 2 and a.shape[-1] == b.shape[0]:
            # (..., k) @ (k, n): one 2-D matmul over the flattened rows (a broadcast weight
            # would otherwise send numpy down a slow batched path).
            return a.reshape(-1, a.shape[-1]).matmul(b).reshape(a.shape[:-1] + (b.shape[1],))
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        if squeeze_a:
            a = a.unsqueeze(0)
        if squeeze_b:
            b = b.unsqueeze(1)
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(
                f"matmul: shapes {self.shape} and {other.shape} do not fit: the last dim of the first ({a.shape[-1]}) "
                f"must equal the second-to-last dim of the second ({b.shape[-2]})")
        dtype = D.promote(a.dtype, b.dtype)
        if a.dtype is not dtype:
            a = a.to(dtype)
        if b.dtype is not dtype:
            b = b.to(dtype)
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], "matmul")
        la = a._layout.broadcast_to(batch + a.shape[-2:], "matmul")
        lb = b._layout.broadcast_to(batch + b.shape[-2:], "matmul")
        shape = batch + (a.shape[-2], b.shape[-1])
        out = self._new(self.device.backend.matmul(a._storage, la, b._storage, lb, dtype), shape, dtype)
        out = self._record(out, (a, b), lambda: G.matmul(a, b))
        if squeeze_a:
            out = out.squeeze(-2)
        if squeeze_b:
            out = out.squeeze(-1)
        return out

    __matmul__ = matmul

    def __rmatmul__(self, other):
        return NotImplemented

    # ---- indexing ops ------------------------------------------------------------------------
    def index_select(self, dim, index):
        from .creation import as_index
        dim = _dim(dim, self.ndim, "index_select")
        index = as_index(index, self.device, "index_select")
        if index.ndim != 1:
            raise ShapeError(f"index_select: the index must be 1-D, got shape {index.shape}")
        check_ids(index, self.shape[dim], "index_select", dim)
        shape = list(self.shape)
        shape[dim] = index.shape[0]
        be = self.device.backend
        if self.dtype.is_quantized:
            if dim != 0:
                raise UnsupportedError("index_select on a quantised tensor picks rows (dim 0) only")
            w = self._base_quant("index_select")
            return self._new(be.index_select(w._storage, w._layout, w.dtype, index._storage, index._layout, 0), tuple(shape), D.f32)
        out = self._new(be.index_select(self._storage, self._layout, self.dtype, index._storage, index._layout, dim), tuple(shape))
        return self._record(out, (self,), lambda: G.index_select(self, dim, index))

    def gather(self, dim, index):
        from .creation import as_index
        dim = _dim(dim, self.ndim, "gather")
        index = as_index(index, self.device, "gather")
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index shape {index.shape} needs as many dims as the input {self.shape}")
        for d, (si, sx) in enumerate(zip(index.shape, self.shape)):
            if d != dim and si > sx:
                raise ShapeError(f"gather: index shape {index.shape} is larger than input {self.shape} in dim {d}")
        check_ids(index, self.shape[dim], "gather", dim)
        out = self._new(self.device.backend.gather(self._storage, self._layout, self.dtype, index._storage, index._layout, dim), index.shape)
        return self._record(out, (self,), lambda: G.gather(self, dim, index))

    def scatter_add(self, dim, index, src):
        from .creation import as_index
        dim = _dim(dim, self.ndim, "scatter_add")
        index = as_index(index, self.device, "scatter_add")
        if index.shape != src.shape:
            raise ShapeError(f"scatter_add: index shape {index.shape} must equal src shape {src.shape}")
        check_ids(index, self.shape[dim], "scatter_add", dim)
        src = src.to(self.dtype)
        st = self.device.backend.scatter_add(self._storage, self._layout, self.dtype, index._storage, index._layout, src._storage, src._layout, dim)
        return self._record(self._new(st, self.shape), (self, src), lambda: G.scatter_add(dim, index))

    # ---- composite ops (see functional.py) -------------------------------------------------
    def softmax(self, dim=-1):
        from .functional import softmax
        return softmax(self, dim)

    def log_softmax(self, dim=-1):
        from .functional import log_softmax
        return log_softmax(self, dim)

    def split(self, split_size, dim=0):
        from .creation import split
        return split(self, split_size, dim)

    def chunk(self, chunks, dim=0):
        from .creation import chunk
        return chunk(self, chunks, dim)


def _quantized_matmul(x, w_t):
    """x @ w.T with w quantised (n, k): the backend dequantises inside its kernel."""
    w = w_t._base_quant("matmul")
    if w_t._layout.strides != (1, w.shape[1]):
        raise UnsupportedError("a quantised weight w (out, in) is used as x @ w.T (or tallow.nn.functional.linear(x, w)); "
                               f"got it as the right operand with shape {w_t.shape} untransposed")
    n, k = w.shape
    if x.shape[-1] != k:
        raise ShapeError(f"matmul: shapes {x.shape} and {w_t.shape} do not fit ({x.shape[-1]} vs {k})")
    dtype = x.dtype if x.dtype.is_float else D.f32
    x = x.to(dtype)
    st = x.device.backend.qmatmul(x._storage, x._layout, dtype, w._storage, w.dtype, n, k)
    out = x._new(st, x.shape[:-1] + (n,), dtype)
    return x._record(out, (x,), lambda: (lambda g: (g @ w.to(dtype),)))


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


def _nest(flat, shape):
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = numel_of(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
