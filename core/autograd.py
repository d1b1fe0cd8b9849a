"""Reverse-mode autograd: an optional tape on top of the tensor ops.

An op records a node (its inputs and a backward function) only when grad
mode is on and one of its inputs requires grad, so inference builds no tape
and pays one attribute test per op. Backward rules are written with tensor
ops, so gradients run on every backend.
"""
from .errors import ShapeError


class _Mode:
    enabled = True


def is_grad_enabled():
    return _Mode.enabled


class no_grad:
    """Context manager / decorator: ops inside record nothing."""

    def __enter__(self):
        self._prev = _Mode.enabled
        _Mode.enabled = False

    def __exit__(self, *exc):
        _Mode.enabled = self._prev

    def __call__(self, fn):
        def wrapper(*a, **k):
            with no_grad():
                return fn(*a, **k)
        wrapper.__name__ = getattr(fn, "__name__", "wrapped")
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper


class enable_grad(no_grad):
    def __enter__(self):
        self._prev = _Mode.enabled
        _Mode.enabled = True


def needs_grad(*tensors):
    """True when an op over these inputs must be recorded."""
    if not _Mode.enabled:
        return False
    for t in tensors:
        if t is not None and getattr(t, "requires_grad", False):
            return True
    return False


def record_if_needed(out, inputs, make_backward):
    """Record out's node when grad mode is on and an input requires grad; make_backward()
    builds the backward function only then, so inference pays one test per input."""
    if _Mode.enabled:
        for t in inputs:
            if t is not None and t.requires_grad:
                return record(out, inputs, make_backward())
    return out


def record(out, inputs, backward):
    """Attach a node to `out`: backward(grad_out) returns one gradient (or None) per input."""
    out.requires_grad = True
    out._node = (backward, tuple(inputs))
    return out


def unbroadcast(grad, shape):
    """Sum a gradient over the dims that broadcasting added or stretched, back to `shape`."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    dims = tuple(range(extra)) + tuple(extra + i for i, s in enumerate(shape) if s == 1 and grad.shape[extra + i] != 1)
    g = grad.sum(dims, keepdim=True) if dims else grad
    return g.reshape(shape)


def _topological(root):
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        node = t._node
        if node is not None:
            for inp in node[1]:
                if inp is not None and getattr(inp, "requires_grad", False) and id(inp) not in seen:
                    stack.append((inp, False))
    return order


def backward(root, grad=None):
    if not root.requires_grad:
        raise ShapeError("backward(): this tensor does not require grad (no input had requires_grad=True)")
    if grad is None:
        if root.numel() != 1:
            raise ShapeError(f"backward(): a gradient must be given for a non-scalar output of shape {root.shape}")
        grad = root.new_full(root.shape, 1)
    grads = {id(root): grad}
    with no_grad():
        for t in reversed(_topological(root)):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            node = t._node
            if node is None:  # a leaf: accumulate into .grad
                t.grad = g if t.grad is None else t.grad + g
                continue
            fn, inputs = node
            for inp, gi in zip(inputs, fn(g)):
                if gi is None or inp is None or not getattr(inp, "requires_grad", False):
                    continue
                if gi.shape != inp.shape:
                    gi = unbroadcast(gi, inp.shape)
                if gi.dtype is not inp.dtype and inp.dtype.is_float:
                    gi = gi.to(inp.dtype)
                prev = grads.get(id(inp))
                grads[id(inp)] = gi if prev is None else prev + gi
