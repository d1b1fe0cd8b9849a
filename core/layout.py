"""Layout: shape, strides (in elements) and offset over a flat storage.

Views (transpose, narrow, broadcast, squeeze, ...) only make a new Layout.
Backends receive (storage, layout) pairs and always return contiguous storage.
"""
import math

from .errors import ShapeError, UnsupportedError

INT32_MAX = (1 << 31) - 1


def contiguous_strides(shape):
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= shape[i]
    return tuple(strides)


def numel_of(shape):
    return math.prod(shape)  # (C's loop: views and ops ask for it often)


def broadcast_shapes(a, b, op="broadcast"):
    if a == b:
        return a
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {tuple(a)} and {tuple(b)} do not broadcast (size {x} vs {y})")
    return tuple(out)


def coalesce_dims(shape, strides_list):
    """Drop size-1 dims and merge neighbouring dims that are contiguous with each other in
    every operand (same shape, one strides list each), so most tensors need one or two dims
    whatever their rank; row-major element order is unchanged. Returns (shape, [strides...])."""
    if len(strides_list) == 1:  # one operand (the pure-Python backend's reads): a tighter loop
        out_shape, out_st = [], []
        for size, stride in zip(shape, strides_list[0]):
            if size == 1:
                continue
            if out_shape and out_st[-1] == stride * size:
                out_shape[-1] *= size
                out_st[-1] = stride
            else:
                out_shape.append(size)
                out_st.append(stride)
        return out_shape, [out_st]
    out_shape, out_strides = [], [[] for _ in strides_list]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out_shape and all(st[-1] == s[d] * size for st, s in zip(out_strides, strides_list)):
            out_shape[-1] *= size
            for st, s in zip(out_strides, strides_list):
                st[-1] = s[d]
        else:
            out_shape.append(size)
            for st, s in zip(out_strides, strides_list):
                st.append(s[d])
    return out_shape, out_strides


def inverse_permutation(perm):
    """inv with inv[perm[i]] == i: permuting by perm, then by inv, restores the order."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def kernel_meta(shape, operands, max_dims, what="op", slots=None, coalesce=True):
    """The int32 words a strided GPU kernel reads to locate element i of each operand:
        [ndim, shape padded to max_dims with 1, then per operand: offset, strides padded with 0]
    `operands` are Layouts of `shape` or (offset, strides) pairs; `slots` pads the operand list
    with zero entries (a kernel with a fixed number of operand slots). Dims are merged first
    (coalesce_dims) unless coalesce=False (kernels that index one dim by number). Raises
    UnsupportedError beyond max_dims dims or beyond int32 offsets/strides."""
    pairs = [(op.offset, op.strides) if isinstance(op, Layout) else op for op in operands]
    if coalesce:
        dims, strides = coalesce_dims(shape, [s for _, s in pairs])
    else:
        dims, strides = list(shape), [list(s) for _, s in pairs]
    if len(dims) > max_dims:
        raise UnsupportedError(f"{what}: {len(dims)} dims remain after merging contiguous ones (at most {max_dims})")
    words = [len(dims)] + dims + [1] * (max_dims - len(dims))
    for (offset, _), st in zip(pairs, strides):
        words += [offset] + st + [0] * (max_dims - len(st))
    if slots is not None:
        words += [0] * ((max_dims + 1) * (slots - len(pairs)))
    if max(words) > INT32_MAX or min(words) < -INT32_MAX:
        raise UnsupportedError(f"{what}: offsets or strides beyond 2**31 elements")
    return words


class Layout:
    __slots__ = ("shape", "_strides", "offset", "_contiguous")

    def __init__(self, shape, strides=None, offset=0):
        self.shape = tuple(shape)
        # A layout made without strides is contiguous by construction: its strides
        # are computed only if asked for (tensor creation is a hot path).
        self._contiguous = True if strides is None else None
        self._strides = None if strides is None else tuple(strides)
        self.offset = offset

    @property
    def strides(self):
        if self._strides is None:
            self._strides = contiguous_strides(self.shape)
        return self._strides

    def numel(self):
        return numel_of(self.shape)

    def is_contiguous(self):
        if self._contiguous is None:
            self._contiguous = self._check_contiguous()
        return self._contiguous

    def _check_contiguous(self):
        acc = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != acc:
                return False
            acc *= size
        return True

    def __repr__(self):
        return f"Layout({self.shape}, {self.strides}, {self.offset})"

    def broadcast_to(self, shape, op="broadcast_to"):
        shape = tuple(shape)
        extra = len(shape) - len(self.shape)
        if extra < 0:
            raise ShapeError(f"{op}: cannot broadcast shape {self.shape} to fewer dims {shape}")
        strides = [0] * extra
        for i, (size, stride) in enumerate(zip(self.shape, self.strides)):
            target = shape[extra + i]
            if size == target:
                strides.append(stride)
            elif size == 1:
                strides.append(0)
            else:
                raise ShapeError(f"{op}: cannot broadcast shape {self.shape} to {shape}")
        return Layout(shape, strides, self.offset)

    def permute(self, dims):
        return Layout([self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset)

    def narrow(self, dim, start, length):
        shape = list(self.shape)
        shape[dim] = length
        return Layout(shape, self.strides, self.offset + start * self.strides[dim])

    def reshaped(self, shape):
        """Layout for a reshape without a copy, or None if the data must be copied first."""
        if self.is_contiguous():
            return Layout(shape, None, self.offset)
        # Group the old dims into runs that are contiguous among themselves and
        # map each new dim onto one run (as torch's view does).
        old = [(s, st) for s, st in zip(self.shape, self.strides) if s != 1]
        new_strides = []
        i = 0
        for size in shape:
            if size == 1:
                new_strides.append(1)
                continue
            if i >= len(old):
                return None
            acc = 1
            while acc < size and i < len(old):
                s, st = old[i]
                if acc > 1 and old[i - 1][1] != s * st:
                    return None
                acc *= s
                i += 1
            if acc != size:
                return None
            new_strides.append(old[i - 1][1])
        return Layout(shape, new_strides, self.offset)

    def coalesced(self):
        """The same elements in the same row-major order with the fewest dims: size-1 dims
        dropped, neighbours contiguous with each other merged (a scalar gets shape ())."""
        shape, (strides,) = coalesce_dims(self.shape, [self.strides])
        return Layout(shape, strides, self.offset)

    def moved_last(self, dims):
        """(perm, layout permuted by perm) with `dims` last in the order given and the other
        dims first in theirs: reductions and scans then read contiguous rows of the result."""
        perm = [d for d in range(len(self.shape)) if d not in dims] + list(dims)
        return perm, self.permute(perm)

    def offsets(self):
        """Flat storage offsets of every element in row-major order (pure-Python backend helper)."""
        idx = [self.offset]
        for size, stride in zip(self.shape, self.strides):
            steps = [k * stride for k in range(size)]
            idx = [base + s for base in idx for s in steps]
        return idx
