"""Reductions (sum, prod, max, min, argmax, argmin, and mean/var/std over them),
cumsum, and softmax / log_softmax over a dim."""
import math

from .. import dtypes as D
from .. import grad_rules as G
from ..autograd import record_if_needed
from ..layout import numel_of
from .arguments import dim_index, dims_of, float_input
from .new import new_full


def reduce(x, op, dim=None, keepdim=False):
    """The backend reduction `op` over dim (None: every dim); integer sums and arg-reductions give i64."""
    dims = dims_of(x, dim, op) if x.ndim else ()
    st = x.device.backend.reduce(op, x._storage, x._layout, x.dtype, dims)
    out_dtype = D.i64 if op in ("argmax", "argmin") or (op in ("sum", "prod") and x.dtype.kind in "iub") else x.dtype
    if keepdim:
        shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    out = x._new(st, shape, out_dtype)
    return record_if_needed(out, (x,), lambda: G.reduce(op, x, out, dims, keepdim)) if out_dtype.is_float else out


def arg_reduce(x, op, dim=None, keepdim=False):
    """argmax / argmin over dim, or over the flattened tensor when dim is None."""
    if dim is None:
        return reduce(x.reshape(-1), op, 0, keepdim)
    return reduce(x, op, dim, keepdim)


def mean(x, dim=None, keepdim=False):
    t = x if x.dtype.is_float else x.to(D.f32)
    n = numel_of([x.shape[d] for d in dims_of(x, dim, "mean")])
    return reduce(t, "sum", dim, keepdim) * (1.0 / n if n else math.nan)


def var(x, dim=None, keepdim=False, correction=1):
    t = x if x.dtype.is_float else x.to(D.f32)
    n = numel_of([x.shape[d] for d in dims_of(x, dim, "var")])
    centred = t - mean(t, dim, keepdim=True)
    denom = n - correction
    return reduce(centred.square(), "sum", dim, keepdim) * (1.0 / denom if denom > 0 else math.nan)


def cumsum(x, dim):
    dim = dim_index(dim, x.ndim, "cumsum")
    out_dtype = D.i64 if x.dtype.kind in "iub" else x.dtype
    out = x._new(x.device.backend.cumsum(x._storage, x._layout, x.dtype, dim), x.shape, out_dtype)
    return record_if_needed(out, (x,), lambda: G.cumsum(dim))


def softmax(x, dim=-1, log=False):
    """softmax (or log_softmax) over dim: the backend's fused kernel runs over the last dim."""
    name = "log_softmax" if log else "softmax"
    x = float_input(x, name)
    if x.ndim == 0:
        return new_full(x, (), 0.0 if log else 1.0)
    dim = dim_index(dim, x.ndim, name)
    if dim != x.ndim - 1:
        return softmax(x.transpose(dim, -1), -1, log).transpose(dim, -1)
    out = x._new(x.device.backend.softmax(x._storage, x._layout, x.dtype, log=log), x.shape)
    return record_if_needed(out, (x,), lambda: G.softmax(out, log))
