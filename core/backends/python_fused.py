"""Fused ops of the pure-Python backend: softmax, norms, rotary embedding, attention.

All arithmetic is in Python floats (f64); the caller rounds to the dtype once.
"""
import math
from itertools import repeat
from operator import add, mul, sub

from .python_linalg import dot, dot_rows, split_rows
from .python_storage import read_list

_NEG_INF = -math.inf


def _softmax_row(row, log):
    m = max(row)
    z = [x - m for x in row]
    e = list(map(math.exp, z))  # z <= 0 (or NaN): never overflows
    s = sum(e)
    if log:
        ls = math.log(s) if s > 0 else (_NEG_INF if s == 0 else s)
        return [v - ls for v in z]
    inv = 1.0 / s  # s >= 1 (the max term is exp(0)) unless the row holds NaN
    return [v * inv for v in e]  # a multiply: much cheaper than a divide in CPython


def softmax(storage, layout, log):
    d = layout.shape[-1] if layout.shape else 1
    if layout.numel() == 0:
        return []
    out = []
    for row in split_rows(read_list(storage, layout), d):
        out.extend(_softmax_row(row, log))
    return out


def layer_norm(x, lx, w, lw, b, lb, eps):
    d = lx.shape[-1]
    if lx.numel() == 0:
        return []
    W = read_list(w, lw) if w is not None else None
    B = read_list(b, lb) if b is not None else None
    out = []
    for row in split_rows(read_list(x, lx), d):
        mean = sum(row) / d
        c = [v - mean for v in row]
        inv = 1.0 / math.sqrt(dot(c, c) / d + eps)
        y = [v * inv for v in c]
        if W is not None:
            y = list(map(mul, y, W))
        if B is not None:
            y = list(map(add, y, B))
        out.extend(y)
    return out


def rms_norm(x, lx, w, lw, eps):
    d = lx.shape[-1]
    if lx.numel() == 0:
        return []
    W = read_list(w, lw) if w is not None else None
    out = []
    for row in split_rows(read_list(x, lx), d):
        inv = 1.0 / math.sqrt(dot(row, row) / d + eps)
        y = [v * inv for v in row]
        out.extend(map(mul, y, W) if W is not None else y)
    return out


def rope(x, lx, cos, lcos, sin, lsin, interleaved):
    """x (..., t, d); cos/sin broadcast to (..., t, d/2)."""
    d = lx.shape[-1]
    h = d // 2
    if lx.numel() == 0:
        return []
    half_shape = lx.shape[:-1] + (h,)
    C = split_rows(read_list(cos, lcos.broadcast_to(half_shape, "rope")), h)
    S = split_rows(read_list(sin, lsin.broadcast_to(half_shape, "rope")), h)
    out = []
    for row, c, s in zip(split_rows(read_list(x, lx), d), C, S):
        if interleaved:
            x1, x2 = row[0::2], row[1::2]
        else:
            x1, x2 = row[:h], row[h:]
        o1 = list(map(sub, map(mul, x1, c), map(mul, x2, s)))
        o2 = list(map(add, map(mul, x1, s), map(mul, x2, c)))
        if interleaved:
            row = [0.0] * d
            row[0::2] = o1
            row[1::2] = o2
            out.extend(row)
        else:
            out.extend(o1)
            out.extend(o2)
    return out


def attention(q, lq, k, lk, v, lv, mask, lmask, scale, causal):
    """softmax(q k^T * scale + mask) v per (batch, head), one query row at a time."""
    b, h, tq, d = lq.shape
    tk = lk.shape[2]
    dv = lv.shape[3]
    if b * h * tq * dv == 0:
        return []
    if tk == 0:
        return [0.0] * (b * h * tq * dv)
    Q = split_rows(read_list(q, lq), d)
    K = split_rows(read_list(k, lk), d)
    VT = split_rows(read_list(v, lv.permute((0, 1, 3, 2))), tk)  # columns of v
    M = split_rows(read_list(mask, lmask), tk) if mask is not None else None
    out = []
    for bh in range(b * h):
        keys = K[bh * tk:(bh + 1) * tk]
        vcols = VT[bh * dv:(bh + 1) * dv]
        for i in range(tq):
            scores = [s * scale for s in dot_rows(Q[bh * tq + i], keys)]
            if M is not None:
                scores = list(map(add, scores, M[bh * tq + i]))
            if causal:
                first_banned = max(i + (tk - tq) + 1, 0)
                if first_banned < tk:
                    scores[first_banned:] = repeat(_NEG_INF, tk - first_banned)
            m = max(scores)
            e = [math.exp(s - m) for s in scores]
            total = sum(e)
            inv = 1.0 / total if total else math.nan
            p = [x * inv for x in e]
            out.extend(dot_rows(p, vcols))
    return out
