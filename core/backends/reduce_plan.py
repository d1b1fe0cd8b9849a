"""How both GPU planners (WgpuBackend; KernelBackend for CUDA/Metal) lay out a reduction before
choosing their kernel: which ops exist, the result dtype, the refusals, and the rows and row
length the kernels walk once the reduced dims are moved last. One definition, so the two agree
on every edge (empty dims, integer sums, an arg-reduction over several dims).
"""
from typing import Any, NamedTuple

from tallow.dtypes import i64
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import numel_of

REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin")


class ReducePlan(NamedTuple):
    out_dtype: Any  # i64 for arg-reductions and integer sums/products, else the input's dtype
    rows: int       # output elements: one per row
    length: int     # elements reduced into each
    layout: Any     # the input's layout with the reduced dims last (kept dims first, in order)


def plan_reduce(backend, op, layout, dtype, dims):
    """The plan of reducing `dims` (sorted) of layout by op on the named backend. Refuses, as
    numpy and torch do, max/min/argmax/argmin over an empty dim, even into an empty output
    (they have no identity); a sum or product of nothing is 0 or 1."""
    if op not in REDUCE_OPS:
        raise UnsupportedError(f"the {backend} backend has no reduce {op}")
    dims = tuple(sorted(dims))
    arg = op in ("argmax", "argmin")
    if arg and len(dims) != 1:
        raise ShapeError(f"{op} takes exactly one dim, got {dims}")
    _, moved = layout.moved_last(dims)
    kept = len(moved.shape) - len(dims)
    rows, length = numel_of(moved.shape[:kept]), numel_of(moved.shape[kept:])
    if length == 0 and op not in ("sum", "prod"):
        raise ShapeError(f"{op} over an empty dim of shape {layout.shape}")
    out_dtype = i64 if arg or (op in ("sum", "prod") and not dtype.is_float) else dtype
    return ReducePlan(out_dtype, rows, length, moved)
