"""Backward rules of the primitive tensor ops, written with tensor ops.

Each function returns backward(grad_out) -> one gradient (or None) per input.
Broadcast inputs are reduced back to their shape by autograd.backward.
"""


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
        return (g.new_zeros(x.shape).scatter_add(dim, idx, g),)
    return back


def gather(x, dim, index):
    return lambda g: (g.new_zeros(x.shape).scatter_add(dim, index, g),)


def scatter_add(dim, index):
    return lambda g: (g, g.gather(dim, index))


def view_into(shape, key):
    """For a basic-index view: scatter the gradient into zeros of the input's shape."""
    def back(g):
        z = g.new_zeros(shape)
        z[key] = g
        return (z,)
    return back


def cast(src_dtype):
    return lambda g: (g.to(src_dtype) if src_dtype.is_float else None,)


def where(cond):
    return lambda g: (None, g.where(cond, 0.0), g.masked_fill(cond, 0.0))


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

