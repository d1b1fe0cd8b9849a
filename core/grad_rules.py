"""Backward rules of the primitive tensor ops, written with tensor ops.

Each function returns backward(grad_out) -> one gradient (or None) per input.
Broadcast inputs are reduced back to their shape by autograd.backward.
"""
import math

_SQRT_2PI = math.sqrt(2 * math.pi)
_GELU_C = math.sqrt(2 / math.pi)


def _zeros(shape, like):
    from .creation import zeros
    return zeros(*shape, dtype=like.dtype, device=like.device)


def unary(op, x, out, arg):
    if op == "neg":
        return lambda g: (-g,)
    if op == "abs":
        return lambda g: (g * x.sign(),)
    if op == "exp":
        return lambda g: (g * out,)
    if op == "log":
        return lambda g: (g / x,)
    if op == "sqrt":
        return lambda g: (g * 0.5 / out,)
    if op == "rsqrt":
        return lambda g: (g * -0.5 * out * out * out,)
    if op == "sin":
        return lambda g: (g * x.cos(),)
    if op == "cos":
        return lambda g: (-g * x.sin(),)
    if op == "tanh":
        return lambda g: (g * (1.0 - out * out),)
    if op == "sigmoid":
        return lambda g: (g * out * (1.0 - out),)
    if op == "relu":
        return lambda g: (g * (x > 0).to(g.dtype),)
    if op == "square":
        return lambda g: (g * 2.0 * x,)
    if op == "reciprocal":
        return lambda g: (-g * out * out,)
    if op == "silu":
        def silu(g):
            s = x.sigmoid()
            return (g * s * (1.0 + x * (1.0 - s)),)
        return silu
    if op == "gelu":
        def gelu(g):
            from .creation import where
            cdf = where(x == 0, 0.5, out / where(x == 0, 1.0, x))  # Phi(x) = gelu(x) / x
            pdf = (x * x * -0.5).exp() * (1 / _SQRT_2PI)
            return (g * (cdf + x * pdf),)
        return gelu
    if op == "gelu_tanh":
        def gelu_tanh(g):
            t = ((x + x * x * x * 0.044715) * _GELU_C).tanh()
            d = (1.0 + t) * 0.5 + x * 0.5 * (1.0 - t * t) * _GELU_C * (1.0 + x * x * (3 * 0.044715))
            return (g * d,)
        return gelu_tanh
    if op == "clamp":
        lo, hi = arg
        def clamp(g):
            keep = g.dtype
            m = (x >= lo).to(keep) if lo is not None else None
            if hi is not None:
                mh = (x <= hi).to(keep)
                m = mh if m is None else m * mh
            return (g if m is None else g * m,)
        return clamp
    if op == "pow_scalar":
        return lambda g: (g * arg * x.pow(arg - 1),)
    if op == "affine":
        return lambda g: (g * arg[0],)
    return lambda g: (None,)  # floor, ceil, round, sign, logical_not: zero gradient


def binary(op, a, b, out):
    if op == "add":
        return lambda g: (g, g)
    if op == "sub":
        return lambda g: (g, -g)
    if op == "mul":
        return lambda g: (g * b, g * a)
    if op == "div":
        return lambda g: (g / b, -g * a / (b * b))
    if op == "pow":
        return lambda g: (g * b * a.pow(b - 1.0), g * out * a.log())
    if op in ("maximum", "minimum"):
        def pick(g):
            first = (a >= b) if op == "maximum" else (a <= b)
            m = first.to(g.dtype)
            return (g * m, g * (1.0 - m))
        return pick
    return lambda g: (None, None)


def reduce(op, x, out, dims, keepdim):
    def expand(g):
        if not keepdim:
            for d in dims:
                g = g.unsqueeze(d)
        return g.expand(x.shape)

    if op == "sum":
        return lambda g: (expand(g),)
    if op in ("max", "min"):
        def extreme(g):
            o = expand(out)
            m = (x == o).to(g.dtype)
            count = m.sum(dims, keepdim=True)
            return (expand(g) * m / count,)
        return extreme
    if op == "prod":
        return lambda g: (expand(g) * expand(out) / x,)
    return lambda g: (None,)


def matmul(a, b):
    return lambda g: (g @ b.transpose(-1, -2), a.transpose(-1, -2) @ g)


def cumsum(dim):
    return lambda g: (g.sum(dim, keepdim=True) - g.cumsum(dim) + g,)


def index_select(x, dim, index):
    def back(g):
        shape = [1] * g.ndim
        shape[dim] = index.shape[0]
        idx = index.reshape(shape).expand(g.shape).contiguous()
        return (_zeros(x.shape, g).scatter_add(dim, idx, g),)
    return back


def gather(x, dim, index):
    return lambda g: (_zeros(x.shape, g).scatter_add(dim, index, g),)


def scatter_add(dim, index):
    return lambda g: (g, g.gather(dim, index))


def view_into(shape, key):
    """For a basic-index view: scatter the gradient into zeros of the input's shape."""
    def back(g):
        z = _zeros(shape, g)
        z[key] = g
        return (z,)
    return back


def cast(src_dtype):
    return lambda g: (g.to(src_dtype) if src_dtype.is_float else None,)


def where(cond):
    from .creation import where as _where
    return lambda g: (None, _where(cond, g, 0.0), _where(cond, 0.0, g))


def cat(tensors, dim):
    sizes = [t.shape[dim] for t in tensors]

    def back(g):
        out, pos = [], 0
        for n in sizes:
            out.append(g.narrow(dim, pos, n))
            pos += n
        return tuple(out)
    return back


def softmax(out, log):
    if log:
        return lambda g: (g - out.exp() * g.sum(-1, keepdim=True),)
    return lambda g: (out * (g - (g * out).sum(-1, keepdim=True)),)

