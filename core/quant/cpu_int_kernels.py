"""numba kernels for decoding steps: integer dot products on GGUF blocks, as ggml does.

The activation row is quantised once per call in blocks of 32 (`quantize_rows`:
ggml's quantize_row_q8_0/q8_1 -- scale d = amax/qmax, values round(x/d), and the
block's sum of values for the formats with a min or an offset). Then each 32-value
block of a weight row is an int32 dot of its 4/5/6/8-bit quants with the integer
activations, scaled once per block, as in ggml's ggml_vec_dot_q4_0_q8_0,
q4_1_q8_1, q5_0_q8_0, q5_1_q8_1, q8_0_q8_0, q4_K_q8_K, q5_K_q8_K, q6_K_q8_K.
(The K-quants use 32-value activation blocks here, not ggml's one scale per
256: the same maths, finer activation scales.)

ggml quantises activations to 8 bits (qmax 127) so that AVX2 can multiply bytes
(vpmaddubsw). Here the quants are widened to 16 bits and multiplied in 16-bit
pairs (vpmaddwd / vpdpwssd; cpu_simd.py for q4_0-q8_0), so 16-bit activations
(qmax 32767) cost the same and are 256x more precise: with 8 bits SmolLM2's first greedy
token on "What is the capital of France?" flipped (a 0.05 logit near-tie moved by
up to 0.26). cpu_matmul.py chooses 16 bits; every product and block sum still
fits int32 (31 * 32767 * 32 < 2^31), and sums are scaled in float32.

The result is exactly the float dot of the dequantised weights with the
dequantised activations (up to float32 summation order), so its error against
the float activations is at most sum_j |w_j| * d_b / 2 for activation block b
(tests/test_cpu_kernels.py checks that bound).

The K-quants' loops are plain Python over numpy arrays, so NUMBA_DISABLE_JIT=1
runs the same code (slowly); q4_0-q8_0 run cpu_simd.py's vector IR, whose numpy
statement (cpu_simd.pair_dot_py) runs instead then. Integers are widened to int32 before arithmetic (uint8 arithmetic
would wrap in plain numpy), and int32 sums are converted to float32 before they
are multiplied by the K-quants' integer scales (which could overflow int32).
"""
import math

import numpy as np
from numba import njit

from . import cpu_simd
from .cpu_kernels import _f16, _scale_min_k4

QK = 32  # activation values per block (one scale each)


@njit(cache=True, inline="always")
def _roundf(v):
    """C's roundf (half away from zero), computed as gguf.quants' np_roundf does: floor(|v| + 0.5)
    would round 0.49999997 up, since |v| + 0.5 rounds to 1.0 in float32."""
    a = abs(v)
    f = np.floor(a)
    r = f + np.floor(np.float32(2.0) * (a - f))
    return r if v >= 0 else -r


@njit(cache=True)
def quantize_rows(x, qmax, qx, dx, sx):
    """x (m, k) float32 -> qx (m, k) integers in [-qmax, qmax] (int8 for qmax 127, int16 for 32767),
    dx (m, k/32) float32 scales amax/qmax, sx (m, k/32) int32 block sums."""
    m, k = x.shape
    for i in range(m):
        for b in range(k // QK):
            amax = np.float32(0.0)
            for j in range(QK):
                amax = max(amax, abs(x[i, b * QK + j]))
            d = amax / np.float32(qmax)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            s = np.int32(0)
            for j in range(QK):
                q = np.int32(_roundf(x[i, b * QK + j] * inv))
                qx[i, b * QK + j] = q
                s += q
            dx[i, b] = d
            sx[i, b] = s


@njit(cache=True, inline="always")
def _dot_k4(wb, hb, g, xb1, xb2, n, five):
    """One 64-value group g of a q4_K/q5_K block: (sum of low nibbles x xb1, sum of high x xb2),
    with q5_K's fifth bits from bits 2g and 2g+1 of hb."""
    s1 = np.int32(0)
    s2 = np.int32(0)
    for j in range(n):
        v = np.int32(wb[j])
        lo = np.int32(v & 0x0F)
        hi = np.int32(v >> 4)
        if five:
            h = np.int32(hb[j])
            lo = np.int32(lo | (((h >> (2 * g)) & 1) << 4))
            hi = np.int32(hi | (((h >> (2 * g + 1)) & 1) << 4))
        s1 = np.int32(s1 + lo * np.int32(xb1[j]))
        s2 = np.int32(s2 + hi * np.int32(xb2[j]))
    return s1, s2


@njit(cache=True, inline="always")
def _dot_q6(lb, hb, shift_l, shift_h, xb, half):
    """One 32-value quarter of a q6_K half-block, as two 16-value sums (they have their own scales):
    low 4 bits from lb >> shift_l, high 2 from hb >> shift_h, minus 32."""
    s_a = np.int32(0)
    s_b = np.int32(0)
    for j in range(half):
        qa = np.int32((((np.int32(lb[j]) >> shift_l) & 0x0F) | (((np.int32(hb[j]) >> shift_h) & 3) << 4)) - 32)
        qb = np.int32((((np.int32(lb[half + j]) >> shift_l) & 0x0F)
                       | (((np.int32(hb[half + j]) >> shift_h) & 3) << 4)) - 32)
        s_a = np.int32(s_a + qa * np.int32(xb[j]))
        s_b = np.int32(s_b + qb * np.int32(xb[half + j]))
    return s_a, s_b


@njit(cache=True, inline="always")
def _row_dot(fmt, w, w8, blocks, block_bytes, xi, dxi, sxi, table, half):
    """The dot of one weight row (its blocks: w uint8, w8 the same bytes as int8) with one
    quantised activation row (xi int8, dxi scales, sxi block sums). Blocks and activations
    are passed to the dot helpers as slices, so their indices are the loop variable alone:
    offsets of unknown sign keep numba's negative-index wraparound and stop vectorisation."""
    acc = np.float32(0.0)
    for b in range(blocks):
        o = b * block_bytes
        if fmt <= 6:  # q4_k / q5_k: 8 sub-blocks of 32, a 6-bit scale and min each: d*sc*q - dmin*m
            d = _f16(w, o, table)
            dmin = _f16(w, o + 2, table)
            ql = o + 16 if fmt == 5 else o + 48
            hb = w[o + 16:o + 48]
            for g in range(4):
                sc1, m1 = _scale_min_k4(2 * g, w, o + 4)
                sc2, m2 = _scale_min_k4(2 * g + 1, w, o + 4)
                a = b * 8 + 2 * g  # the activation block of the low nibbles (a + 1: the high)
                s1, s2 = _dot_k4(w[ql + 32 * g:ql + 32 * g + 32], hb, g, xi[a * QK:(a + 1) * QK],
                                 xi[(a + 1) * QK:(a + 2) * QK], 2 * half, fmt == 6)
                acc += d * (dxi[a] * np.float32(sc1) * np.float32(s1) + dxi[a + 1] * np.float32(sc2) * np.float32(s2))
                acc -= dmin * (dxi[a] * np.float32(m1) * np.float32(sxi[a])
                               + dxi[a + 1] * np.float32(m2) * np.float32(sxi[a + 1]))
        else:  # q6_k: 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high in qh; value - 32
            d = _f16(w, o + 208, table)
            for hf in range(2):
                ql = o + 64 * hf
                qh = w[o + 128 + 32 * hf:o + 160 + 32 * hf]
                sc = o + 192 + 8 * hf
                for t in range(4):  # quarter t: ql's low (t < 2) or high nibbles of bytes 32*(t % 2)...
                    a = b * 8 + 4 * hf + t
                    lb = w[ql + 32 * (t & 1):ql + 32 * (t & 1) + 32]
                    s_a, s_b = _dot_q6(lb, qh, 4 * (t >> 1), 2 * t, xi[a * QK:(a + 1) * QK], half)
                    acc += d * dxi[a] * (np.float32(w8[sc + 2 * t]) * np.float32(s_a)
                                         + np.float32(w8[sc + 2 * t + 1]) * np.float32(s_b))
    return acc


# The gate activations of gated kernels (ops/decode.py's GATE_ACTS), by code.
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


@njit(cache=True, inline="always")
def _act(v, act):
    """As the numpy backend's unary ops, in float32 (gelu: erf form; gelu_tanh: the tanh approximation)."""
    if act == 0:
        return v / (np.float32(1.0) + np.exp(-v))
    if act == 1:
        return np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.erf(v * np.float32(0.7071067811865476))))
    if act == 2:
        return np.float32(0.5) * v * (np.float32(1.0) + np.tanh(np.float32(0.7978845608028654)
                                                                * (v + np.float32(0.044715) * v * v * v)))
    return max(v, np.float32(0.0))


@njit(cache=True, inline="always")
def _pair_dot(fmt, raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table):
    """The dots of the weight rows at byte offsets oa and ob of raw with one quantised activation
    row: cpu_simd's vector kernels, for q4_0, q4_1, q5_0, q5_1, q8_0 (fmt 0-4)."""
    if fmt == 0:
        return cpu_simd.pair_dot_q4_0(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)
    if fmt == 1:
        return cpu_simd.pair_dot_q4_1(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)
    if fmt == 2:
        return cpu_simd.pair_dot_q5_0(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)
    if fmt == 3:
        return cpu_simd.pair_dot_q5_1(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)
    return cpu_simd.pair_dot_q8_0(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)


@njit(cache=True, nogil=True)
def qmatmul_q(fmt, block_size, block_bytes, raw, qx, dx, sx, table, out, half, bias, gated, act, start, stop):
    """Columns start...stop-1 of out (m, n) = the quantised activations (qx, dx, sx from
    quantize_rows) times the transpose of the (n, k) block matrix in raw (uint8), plus bias (n,)
    unless it is empty. gated: raw holds 2n rows [gate; up] and out[i, r] = act(gate_r . x_i) *
    (up_r . x_i), both rows read in the same pass (act: ACT_CODES). Without the GIL, so
    cpu_threads.RowPool's threads share a product's rows. `half` is 16, passed at run time:
    a constant trip count made LLVM unroll the block loops and leave them scalar.
    q4_0 ... q8_0 take two weight rows per call of cpu_simd's kernels (one activation load
    for both); the K-quants one row at a time (_row_dot)."""
    n = out.shape[1]
    blocks = qx.shape[1] // block_size
    row_bytes = blocks * block_bytes
    if fmt <= 4:
        for i in range(qx.shape[0]):
            xi, dxi, sxi = qx[i], dx[i], sx[i]
            if gated:  # pairs: gate row r with up row n + r
                for r in range(start, stop):
                    y, up = _pair_dot(fmt, raw, r * row_bytes, (n + r) * row_bytes, blocks, block_bytes, xi, dxi,
                                      sxi, table)
                    out[i, r] = _act(y, act) * up
            else:  # pairs: rows r and r + 1 (a last odd row twice)
                for r in range(start, stop, 2):
                    r2 = min(r + 1, stop - 1)
                    y, y2 = _pair_dot(fmt, raw, r * row_bytes, r2 * row_bytes, blocks, block_bytes, xi, dxi, sxi,
                                      table)
                    if bias.shape[0]:
                        y += bias[r]
                        y2 += bias[r2]
                    out[i, r] = y
                    out[i, r2] = y2
        return
    raw8 = raw.view(np.int8)
    for r in range(start, stop):
        o = r * row_bytes
        for i in range(qx.shape[0]):
            y = _row_dot(fmt, raw[o:o + row_bytes], raw8[o:o + row_bytes], blocks, block_bytes,
                         qx[i], dx[i], sx[i], table, half)
            if gated:
                u = n * row_bytes + o
                up = _row_dot(fmt, raw[u:u + row_bytes], raw8[u:u + row_bytes], blocks, block_bytes,
                              qx[i], dx[i], sx[i], table, half)
                y = _act(y, act) * up
            elif bias.shape[0]:
                y += bias[r]
            out[i, r] = y
