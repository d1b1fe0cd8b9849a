"""numba kernels for the fused decode ops of the CPU device (core/backends/base.py's add_rms_norm,
add_layer_norm, rope_kv_write, kv_write, attention of a few query rows over a KV cache, and
cache_attention: the rotation, the cache write and that attention together): one compiled call
each where the composed defaults make several numpy calls and temporaries. Also the float
models' GELU (backends/cpu/gelu.py), a softmax's numerator over blocks of attention scores
(backends/cpu/attention.py), and attention of a few query rows over many unmasked keys
(Whisper's cross-attention over the audio), a range of heads at a time so the threads of a
step program share them.

Imported only with numba installed, through backends/cpu/runtime/kernel_calls.py's kernels(); the numpy
backend uses them for float32 operands and keeps its numpy path for everything else.
Plain Python over numpy arrays, so NUMBA_DISABLE_JIT=1 runs the same code. Sums run in
float64 and results are rounded to float32 once (the composed path rounds each step).
"""
import math

import numpy as np

from .codes import (  # (BINARY_CODES: binary_f32's ops)
    ERF_P, ERF_Q, GELU_CLAMP, INV_SQRT2, TANH_CLAMP, TANH_P, TANH_Q, entry)
from .numba_setup import prepare

prepare()  # before any kernel loads: numba then does not import scipy's BLAS (numba_setup.py)
from numba import njit  # noqa: E402

from . import vector_ir  # noqa: E402


@entry("f32[2]", "f32[2]", "f32[1]", "f64", "f32[2]", "f32[2]", step=True)
@njit(cache=True)
def add_rms_norm(x, r, w, eps, total, normed):
    """total = x + r; normed = total / sqrt(mean(total^2) + eps) * w (w empty: no weight). All (m, d)
    except w (d,) or (0,)."""
    m, d = x.shape
    for i in range(m):
        ss = 0.0
        for j in range(d):
            v = x[i, j] + r[i, j]
            total[i, j] = v
            ss += np.float64(v) * v
        inv = 1.0 / math.sqrt(ss / d + eps)
        for j in range(d):
            y = total[i, j] * inv
            normed[i, j] = y * w[j] if w.shape[0] else y


@entry("f32[2]", "f32[1]", "f64", "f32[2]", step=True)
@njit(cache=True)
def rms_norm(x, w, eps, normed):
    """normed = x / sqrt(mean(x^2) + eps) * w (w empty: no weight); x, normed (m, d), w (d,) or (0,).
    (Gemma's q/k norms per head and its norms after attention and the MLP, inside a captured step.)"""
    m, d = x.shape
    for i in range(m):
        ss = 0.0
        for j in range(d):
            v = x[i, j]
            ss += np.float64(v) * v
        inv = 1.0 / math.sqrt(ss / d + eps)
        for j in range(d):
            y = x[i, j] * inv
            normed[i, j] = y * w[j] if w.shape[0] else y


@entry("f32[1]", "f32[1]", "i64", "f32[1]", step=True)
@njit(cache=True)
def binary_f32(a, b, op, out):
    """out = a (op) b for float32 vectors, b of a's size or one value (BINARY_CODES): numpy's own
    float32 add, subtract or multiply, one rounding each, so the same bits. (A residual add, or
    Gemma's embedding scale, inside a captured step.)"""
    n = a.shape[0]
    one = b.shape[0] == 1
    for i in range(n):
        y = b[0] if one else b[i]
        if op == 0:
            out[i] = a[i] + y
        elif op == 1:
            out[i] = a[i] - y
        else:
            out[i] = a[i] * y


@entry("f32[2]", "f32[2]", "f32[1]", "f32[1]", "f64", "f32[2]", "f32[2]")
@njit(cache=True)
def add_layer_norm(x, r, w, b, eps, total, normed):
    """total = x + r; normed = (total - mean) / sqrt(var + eps) * w + b (w, b empty: none)."""
    m, d = x.shape
    for i in range(m):
        s = 0.0
        for j in range(d):
            v = x[i, j] + r[i, j]
            total[i, j] = v
            s += v
        mean = s / d
        ss = 0.0
        for j in range(d):
            c = total[i, j] - mean
            ss += c * c
        inv = 1.0 / math.sqrt(ss / d + eps)
        for j in range(d):
            y = (total[i, j] - mean) * inv
            if w.shape[0]:
                y *= w[j]
            if b.shape[0]:
                y += b[j]
            normed[i, j] = y


@njit(cache=True, inline="always")
def _rotate(src, cos, sin, dst, interleaved):
    """dst (b, h, t, d) = src rotated by the rotary tables cos/sin (t, d/2): pairs (x[j], x[j + d/2]),
    or (x[2j], x[2j + 1]) when interleaved."""
    bs, h, t, d = src.shape
    half = d // 2
    for bi in range(bs):
        for hi in range(h):
            for ti in range(t):
                for j in range(half):
                    a = 2 * j if interleaved else j
                    z = a + 1 if interleaved else j + half
                    x1 = src[bi, hi, ti, a]
                    x2 = src[bi, hi, ti, z]
                    c = cos[ti, j]
                    s = sin[ti, j]
                    dst[bi, hi, ti, a] = x1 * c - x2 * s
                    dst[bi, hi, ti, z] = x1 * s + x2 * c


@entry("f32[4A]", "f32[4A]", "f32[4A]", "f32[2]", "f32[2]", "f32[4A]", "f32[4A]", "f32[4]", "bool")
@njit(cache=True)
def rope_kv_write(q, k, v, cos, sin, k_slot, v_slot, q_out, interleaved):
    """q_out = rope(q); k_slot = rope(k) and v_slot = v, in place (views of the KV cache)."""
    _rotate(q, cos, sin, q_out, interleaved)
    _rotate(k, cos, sin, k_slot, interleaved)
    v_slot[...] = v


@entry("f32[4A]", "f32[4A]", "f32[4A]", "f32[4A]")
@njit(cache=True)
def kv_write(k, v, k_slot, v_slot):
    k_slot[...] = k
    v_slot[...] = v


@njit(cache=True, fastmath={"reassoc", "contract"})  # reassociation lets LLVM vectorise the dot sums
def attention(q, k, ko, ks, v, vo, vs, shape, scale, causal, out):
    """out (b, h, tq, dv) = softmax(q k^T * scale) v, q (b, h, tq, d) contiguous. k and v are
    (b, hk, tk, d/dv) views given as their flat storage, offset and (b, h, t) strides, rows
    contiguous (so the dot loops vectorise); shape = (hk, tk, dv). h is a multiple of hk
    (query head i reads KV head i // (h / hk)); causal bans key j > i + tk - tq. For a few
    query rows (decoding): one pass over the cache per row, no (tq, tk) temporary."""
    _attend(q, k, ko, ks[0], ks[1], ks[2], v, vo, vs[0], vs[1], vs[2], shape[0], shape[1], shape[2], scale, causal,
            out)


@entry("f32[4]", "f32[4]", "f32[4]", "f32[2]", "f32[2]", "f32[4]", "f32[4]", "i64", "i64", "f32", "bool", "f32[4]")
@njit(cache=True, fastmath={"reassoc", "contract"})
def cache_attention(q, k, v, cos, sin, kc, vc, position, key_start, scale, interleaved, out):
    """base.py's cache_attention for a decoding step, as one call: writes k (rotated when cos is
    not empty) and v into the contiguous caches kc, vc (b, hk, capacity, d/dv) at [position,
    position + t), then out (b, h, t, dv) = causal attention of q (rotated likewise) over the
    keys [key_start, position + t)."""
    bs, hk, cap, d = kc.shape
    t = q.shape[2]
    dv = vc.shape[3]
    k_slot = kc[:, :, position:position + t]
    v_slot = vc[:, :, position:position + t]
    if cos.shape[0]:
        q_rot = np.empty(q.shape, dtype=np.float32)
        _rotate(q, cos, sin, q_rot, interleaved)
        _rotate(k, cos, sin, k_slot, interleaved)
    else:
        q_rot = np.ascontiguousarray(q)
        k_slot[...] = k
    v_slot[...] = v
    _attend(q_rot, kc.reshape(-1), key_start * d, hk * cap * d, cap * d, d, vc.reshape(-1), key_start * dv,
            hk * cap * dv, cap * dv, dv, hk, position + t - key_start, dv, scale, True, out)


@njit(cache=True, inline="always")
def _attend(q, k, ko, ks0, ks1, ks2, v, vo, vs0, vs1, vs2, hk, tk, dv, scale, causal, out):
    """attention's loops, with the strides as scalars."""
    bs, h, tq, d = q.shape
    rep = h // hk
    scores = np.empty(tk, dtype=np.float32)
    acc = np.empty(dv, dtype=np.float32)
    for bi in range(bs):
        for hi in range(h):
            kh = hi // rep
            for i in range(tq):
                last = min(tk, i + tk - tq + 1) if causal else tk
                qi = q[bi, hi, i]
                top = np.float32(-np.inf)
                for j in range(last):
                    row = k[ko + bi * ks0 + kh * ks1 + j * ks2:]
                    s = np.float32(0.0)
                    for c in range(d):
                        s += qi[c] * row[c]
                    s *= scale
                    scores[j] = s
                    top = max(top, s)
                acc[:] = 0.0
                total = np.float32(0.0)
                for j in range(last):
                    e = np.float32(math.exp(scores[j] - top))
                    total += e
                    row = v[vo + bi * vs0 + kh * vs1 + j * vs2:]
                    for c in range(dv):
                        acc[c] += e * row[c]
                for c in range(dv):
                    out[bi, hi, i, c] = acc[c] / total if last else np.nan


# GELU's constants as float32 (numba freezes globals as constants of their type).
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = (np.float32(c) for c in ERF_P)
_Q0, _Q1, _Q2, _Q3, _Q4 = (np.float32(c) for c in ERF_Q)
_S, _LIM, _HALF, _ONE = np.float32(INV_SQRT2), np.float32(GELU_CLAMP), np.float32(0.5), np.float32(1.0)


# error_model="numpy": no Python ZeroDivisionError check in the loop, whose branch kept LLVM
# from vectorising it (measured 18 ms -> 0.5 ms on 1500x1536). The same float32 operations
# in the same order as gelu's numpy passes and no fused multiply-adds, so both give the
# same bits: whether the kernels run in a process must not change a transcript.
@njit(inline="always", error_model="numpy")
def _gelu_one(v):
    # No branches: the clamps are selects that keep NaN (a comparison with NaN is false).
    z = v * _S
    z = _LIM if z > _LIM else z
    z = -_LIM if z < -_LIM else z
    z2 = z * z
    p = ((((((_P0 * z2 + _P1) * z2 + _P2) * z2 + _P3) * z2 + _P4) * z2 + _P5) * z2 + _P6) * z
    q = (((_Q0 * z2 + _Q1) * z2 + _Q2) * z2 + _Q3) * z2 + _Q4
    return ((p / q + _ONE) * _HALF) * v


@entry("f32[1]", "f32[1]", step=True)
@njit(cache=True, error_model="numpy")
def gelu(x, out):
    """out = GELU(x) (exact, erf form), both 1-d float32, not overlapping."""
    for i in range(x.size):  # one flat loop: LLVM vectorises it
        out[i] = _gelu_one(x[i])


_T = tuple(np.float32(c) for c in TANH_P)
_U = tuple(np.float32(c) for c in TANH_Q)
_TLIM, _GC0, _GC1, _ZERO = (np.float32(TANH_CLAMP), np.float32(0.7978845608028654), np.float32(0.044715),
                            np.float32(0.0))


@njit(inline="always", error_model="numpy")
def _tanh_one(v):
    """tanh in float32 by the rational form of codes.TANH_P / TANH_Q, branch-free so LLVM
    vectorises the loops that call it (numba's np.tanh / np.exp stay scalar library calls)."""
    z = _TLIM if v > _TLIM else v
    z = -_TLIM if z < -_TLIM else z
    z2 = z * z
    p = ((((((_T[6] * z2 + _T[5]) * z2 + _T[4]) * z2 + _T[3]) * z2 + _T[2]) * z2 + _T[1]) * z2 + _T[0]) * z
    q = ((_U[3] * z2 + _U[2]) * z2 + _U[1]) * z2 + _U[0]
    return p / q


@entry("f32[2]", "i64", "f32[2]", step=True)
@njit(cache=True, error_model="numpy")
def gate_rows(y, act, out):
    """out (m, n) = act(y[:, :n]) * y[:, n:] for y (m, 2n) ([gate | up] per row, a prompt's gated
    product): act (codes.ACT_CODES) 0 SiLU as v/2 (1 + tanh(v/2)), 1 GELU (erf form, as gelu), 2
    GELU's tanh form, 3 ReLU; one pass where numpy makes a temporary per operation. (SiLU's tanh
    form is within ~3e-6 of v / (1 + e^-v) where v << 0, where numpy's exp gives the tiny exact
    value; the prompt's next product quantises these values to 8 bits per 256 anyway.)"""
    m, n = out.shape
    for i in range(m):
        if act == 0:
            for j in range(n):
                v = y[i, j]
                out[i, j] = (_HALF * v) * (_ONE + _tanh_one(_HALF * v)) * y[i, n + j]
        elif act == 3:
            for j in range(n):
                v = y[i, j]
                out[i, j] = (v if v > _ZERO else _ZERO) * y[i, n + j]
        elif act == 1:
            for j in range(n):
                out[i, j] = _gelu_one(y[i, j]) * y[i, n + j]
        else:
            for j in range(n):
                v = y[i, j]
                out[i, j] = (_HALF * v) * (_ONE + _tanh_one(_GC0 * (v + _GC1 * v * v * v))) * y[i, n + j]


# In place gets its own loop over one array: with out and x the same memory, the loop above
# fails LLVM's run-time overlap check and runs scalar (measured 7.3 ms vs 0.5 ms on 1500x1536).
@entry("f32[1]")
@njit(cache=True, error_model="numpy")
def gelu_in_place(x):
    for i in range(x.size):
        x[i] = _gelu_one(x[i])


@entry("f32[2]", "f32[1]")
@njit(cache=True, error_model="numpy")
def softmax_rows(s, totals):
    """Each row of s (m, n) -> e^(row - max(row)) in place, its sum in totals (m,): softmax but
    for the division (which attention does on the smaller output). A row with a NaN, or no
    finite max (all -inf: every key masked), becomes NaN, as numpy's passes make it."""
    for i in range(s.shape[0]):
        total = vector_ir.softmax_numerator(s[i])
        if total != total:
            s[i, :] = np.nan
        totals[i] = total


PREFETCH_KEYS = 16  # keys ahead whose rows cross_attention_rows asks the cache for (4-32 measured: 16 best)


@entry("f32[4]", "f32[4]", "f32[4]", "f32", "f32[4]", "i64", "i64")
@njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def cross_attention_rows(q, kc, vc, scale, out, lo, hi):
    """Query heads lo ... hi - 1 of the b * h in q (b, h, t, d): out (b, h, t, dv) = softmax(q k^T
    * scale) v over every key of kc (bk, h, tk, d) and vc (bk, h, tk, dv), unmasked; bk is b, or 1
    for one audio every row attends to (Whisper's cross-attention). A range of heads at a time,
    so the threads of a step program share them. Per query row: the scores (a vectorised dot
    per key), their exponentials, then the value rows weighted by them (vectorised)."""
    b, h, t, d = q.shape
    bk, _h, tk, _d = kc.shape
    dv = vc.shape[3]
    kf = kc.reshape(-1)
    vf = vc.reshape(-1)
    scores = np.empty(tk, dtype=np.float32)
    acc = np.empty(dv, dtype=np.float32)
    for row in range(lo, hi):
        bi, hi_ = row // h, row % h
        head = (0 if bk == 1 else bi) * h + hi_
        for i in range(t):
            top = np.float32(-np.inf)
            for j in range(tk):
                o = (head * tk + j) * d
                for c in range(0, d, 16):  # (one cache line of 16 floats at a time)
                    vector_ir.prefetch(kf, o + PREFETCH_KEYS * d + c)
                s = np.float32(0.0)
                for c in range(d):
                    s += q[bi, hi_, i, c] * kf[o + c]
                s *= scale
                scores[j] = s
                top = max(top, s)
            total = np.float32(0.0)
            for j in range(tk):
                e = np.exp(scores[j] - top)
                scores[j] = e
                total += e
            acc[:] = 0.0
            for j in range(tk):
                e = scores[j]
                o = (head * tk + j) * dv
                for c in range(0, dv, 16):
                    vector_ir.prefetch(vf, o + PREFETCH_KEYS * dv + c)
                for c in range(dv):
                    acc[c] += e * vf[o + c]
            for c in range(dv):
                out[bi, hi_, i, c] = acc[c] / total
