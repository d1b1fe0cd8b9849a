"""Matmul and convolution of the pure-Python backend.

Both reduce to dot products of Python lists: b is transposed once into rows,
then every output element is one C-level dot (`math.sumprod` on Python 3.12+,
which is also more accurate; `sum(map(mul, ...))` before that).
"""
import math
from itertools import repeat
from operator import mul

from ..layout import Layout
from .python_storage import read_list

_sumprod = getattr(math, "sumprod", None)


def dot_rows(row, cols):
    """[row . c for c in cols] with no Python-level loop per element."""
    if _sumprod is not None:
        return list(map(_sumprod, repeat(row, len(cols)), cols))
    return [sum(map(mul, row, c)) for c in cols]


def dot(a, b):
    return _sumprod(a, b) if _sumprod is not None else sum(map(mul, a, b))


def split_rows(values, length, count=None):
    if length == 0:
        return [[] for _ in range(count or 0)]
    return [values[i:i + length] for i in range(0, len(values), length)]


def _swap_last(layout):
    nd = len(layout.shape)
    return layout.permute(list(range(nd - 2)) + [nd - 1, nd - 2])


def matmul(a, la, b, lb):
    """(*batch, m, k) @ (*batch, k, n) as a flat list of unrounded sums."""
    *batch, m, k = la.shape
    n = lb.shape[-1]
    nb = 1
    for s in batch:
        nb *= s
    A = read_list(a, la)
    BT = read_list(b, _swap_last(lb))  # rows of b^T are the columns of b
    out = []
    for bi in range(nb):
        cols = split_rows(BT[bi * n * k:(bi + 1) * n * k], k, n)
        for i in range(m):
            start = (bi * m + i) * k
            out.extend(dot_rows(A[start:start + k], cols))
    return out


def conv2d(x, lx, w, lw, stride, padding, dilation, groups):
    """Grouped, strided, dilated, zero-padded 2-D convolution as a flat list.

    Per (batch, group) the input is cut into one shifted, strided copy per
    (channel, kh, kw) tap; zip(*taps) turns those into the output positions'
    patches, and each output channel is a row of dots against the patches.
    """
    b, cin, h, wd = lx.shape
    cout, cin_g, kh, kw = lw.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    oh = max((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, 0)
    ow = max((wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1, 0)
    cout_g = cout // groups
    X = read_list(x, lx)
    W = split_rows(read_list(w, lw), cin_g * kh * kw, cout)
    zero_row = [0.0] * (wd + 2 * pw)
    out = []
    if oh * ow == 0:
        return out
    for bi in range(b):
        for g in range(groups):
            taps = []
            for ci in range(g * cin_g, (g + 1) * cin_g):
                base = (bi * cin + ci) * h * wd
                pad = [0.0] * pw
                rows = ([zero_row] * ph + [pad + X[base + r * wd:base + (r + 1) * wd] + pad for r in range(h)]
                        + [zero_row] * ph)
                for ky in range(kh):
                    for kx in range(kw):
                        start = kx * dw
                        stop = start + (ow - 1) * sw + 1
                        tap = []
                        for oy in range(oh):
                            tap += rows[oy * sh + ky * dh][start:stop:sw]
                        taps.append(tap)
            patches = list(zip(*taps))
            for co in range(g * cout_g, (g + 1) * cout_g):
                out.extend(dot_rows(W[co], patches) if taps else [0] * (oh * ow))
    return out


def conv1d_as_2d(lx, lw, stride, padding, dilation):
    """Layouts and parameters of a 1-D convolution seen as a 2-D one of height 1."""
    bx, cx, lxn = lx.shape
    lx2 = Layout((bx, cx, 1, lxn), (lx.strides[0], lx.strides[1], 0, lx.strides[2]), lx.offset)
    co, ci, kl = lw.shape
    lw2 = Layout((co, ci, 1, kl), (lw.strides[0], lw.strides[1], 0, lw.strides[2]), lw.offset)
    return lx2, lw2, (1, stride), (0, padding), (1, dilation)
