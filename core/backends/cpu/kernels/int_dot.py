"""numba kernels for decoding steps: integer dot products on GGUF blocks, as ggml does.

The activation row is quantised once per call in blocks of 32 (`quantize_rows`:
ggml's quantize_row_q8_0/q8_1 -- scale d = amax/qmax, values round(x/d), and the
block's sum of values for the formats with a min or an offset). Then each 32-value
block of a weight row is an int32 dot of its 4/5/6/8-bit quants with the integer
activations, scaled once per block, as in ggml's ggml_vec_dot_q4_0_q8_0,
q4_1_q8_1, q5_0_q8_0, q5_1_q8_1, q8_0_q8_0, q4_K_q8_K, q5_K_q8_K, q6_K_q8_K.
(The K-quants use 32-value activation blocks here, not ggml's one scale per
256: the same maths, finer activation scales; their kernels requantise the 16-bit
values to 8 bits as they read them, for byte products: kquant_ir.py.)

ggml quantises activations to 8 bits (qmax 127) so that AVX2 can multiply bytes
(vpmaddubsw). Here the quants are widened to 16 bits and multiplied in 16-bit
pairs (vpmaddwd / vpdpwssd; vector_ir.py), so 16-bit activations
(qmax 32767) cost the same and are 256x more precise: with 8 bits SmolLM2's first greedy
token on "What is the capital of France?" flipped (a 0.05 logit near-tie moved by
up to 0.26). kernel_calls.py chooses 16 bits; every product and block sum still
fits int32 (31 * 32767 * 32 < 2^31), and sums are scaled in float32.

The result is exactly the float dot of the dequantised weights with the
dequantised activations (up to float32 summation order), so its error against
the float activations is at most sum_j |w_j| * d_b / 2 for activation block b
(tests/test_cpu_kernels.py checks that bound).

The block dots are vector_ir.py's vector IR; the rest is plain Python over numpy
arrays, so NUMBA_DISABLE_JIT=1 runs it (slowly) with vector_ir.dot_py, the
same product in numpy, in place of the IR.
"""
import math

import numpy as np

from .numba_setup import prepare

prepare()  # before any kernel loads (numba_setup.py: the caches' stamps, no scipy BLAS import)
from numba import njit  # noqa: E402

from . import atomics, vector_ir  # noqa: E402
from .codes import ACT_CODES, QK, entry  # noqa: E402,F401 -- (QK: activation values per block; callers read both here too)


@njit(cache=True, inline="always")
def _roundf(v):
    """C's roundf (half away from zero), computed as gguf.quants' np_roundf does: floor(|v| + 0.5)
    would round 0.49999997 up, since |v| + 0.5 rounds to 1.0 in float32."""
    a = abs(v)
    f = np.floor(a)
    r = f + np.floor(np.float32(2.0) * (a - f))
    return r if v >= 0 else -r


@entry("f32[2]", "i64", "i16[2]", "f32[2]", "i32[2]")
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


# The gate activations of gated kernels (ops/decode.py's GATE_ACTS), by code: codes.ACT_CODES.


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
def _store(out, i, r, r2, y, y2, bias, gated, act):
    """Output row i's columns r and r2 from the two weight rows' dots y, y2 (gated: r2 is the up row)."""
    if gated:
        out[i, r] = _act(y, act) * y2
    else:
        if bias.shape[0]:
            y += bias[r]
            y2 += bias[r2]
        out[i, r] = y
        out[i, r2] = y2


@njit(cache=True, nogil=True)
def qmatmul_q(fmt, block_size, block_bytes, raw, qx, dx, sx, table, out, bias, gated, act, start, stop):
    """Columns start...stop-1 of out (m, n) = the quantised activations (qx, dx, sx from
    quantize_rows) times the transpose of the (n, k) block matrix in raw (uint8), plus bias (n,)
    unless it is empty. gated: raw holds 2n rows [gate; up] and out[i, r] = act(gate_r . x_i) *
    (up_r . x_i), both rows read in the same pass (act: ACT_CODES). vector_ir's kernels take two
    weight rows (rows r and r + 1, or gate r and up n + r) times one activation row, or
    TILE_ROWS of them (each weight block unpacked once for all). Without the GIL, so
    threads.RowPool's threads share a product's rows."""
    n = out.shape[1]
    m = qx.shape[0]
    blocks = qx.shape[1] // block_size
    row_bytes = blocks * block_bytes
    tiled = m - m % vector_ir.TILE_ROWS
    for r in range(start, stop, 1 if gated else 2):
        r2 = n + r if gated else min(r + 1, stop - 1)  # (a last odd row twice)
        oa, ob = r * row_bytes, r2 * row_bytes
        for i in range(0, tiled, vector_ir.TILE_ROWS):
            ys = vector_ir.tile_dot(fmt, raw, oa, ob, blocks, block_bytes, qx, dx, sx, table, i)
            _store(out, i, r, r2, ys[0], ys[4], bias, gated, act)
            _store(out, i + 1, r, r2, ys[1], ys[5], bias, gated, act)
            _store(out, i + 2, r, r2, ys[2], ys[6], bias, gated, act)
            _store(out, i + 3, r, r2, ys[3], ys[7], bias, gated, act)
        for i in range(tiled, m):
            y, y2 = vector_ir.dot(fmt, raw, oa, ob, blocks, block_bytes, qx, dx, sx, table, i)
            _store(out, i, r, r2, y, y2, bias, gated, act)


@entry("i64", "i64", "i64", "u8[1]", "i16[2]", "f32[2]", "i32[2]", "f32[1]", "f32[2]", "f32[1]", "bool", "i64", "i64",
       "i64", "i64[1]", returns="bool")
@njit(cache=True, nogil=True)
def qmatmul_shared(fmt, block_size, block_bytes, raw, qx, dx, sx, table, out, bias, gated, act, n_rows, chunks,
                   state):
    """qmatmul_q over chunks of range(n_rows) that every thread calling this takes from
    state[0]; state[1] counts finished chunks. True in the thread that finished the last one
    (threads.RowPool)."""
    last = False
    while True:
        c = atomics.fetch_add(state, 0, 1)
        if c >= chunks:
            return last
        qmatmul_q(fmt, block_size, block_bytes, raw, qx, dx, sx, table, out, bias, gated, act,
                  n_rows * c // chunks, n_rows * (c + 1) // chunks)
        if atomics.fetch_add(state, 1, 1) == chunks - 1:
            last = True
