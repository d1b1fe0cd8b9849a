"""numba kernels that decode GGUF blocks to float32 on the CPU device: embedding rows,
tiles of weight rows for the prompt path (then multiplied by BLAS), and the f16 matmul.
Decoding steps use the integer dot products of cpu_int_kernels.py instead.

Imported only by the numpy backend, and only when numba is installed
(`pip install 'tallow[cpu]'`): `import tallow` never imports numba.

Each weight row is a run of GGUF blocks. `decode_block` turns one block into
block_size float32 values, bit-identical to ggml's `dequantize_row_*` (see
dequant_numpy.py).

Written as plain Python over numpy arrays, so NUMBA_DISABLE_JIT=1 runs the same
code (slowly) and tests can read it. Integers are widened with np.int32 before
any shift or subtraction: uint8 arithmetic would wrap in plain numpy.
"""
import numpy as np

from .numba_setup import prepare

prepare()  # before any kernel loads: numba then does not import scipy's BLAS (numba_setup.py)
from numba import njit, prange  # noqa: E402

from .kernel_codes import F16_TABLE, FORMATS  # noqa: E402,F401 -- (callers read them here too)


@njit(cache=True, inline="always")
def _f16(raw, o, table):
    return table[np.int32(raw[o]) | (np.int32(raw[o + 1]) << 8)]


@njit(cache=True, inline="always")
def _u32(raw, o):
    return (np.uint32(raw[o]) | (np.uint32(raw[o + 1]) << np.uint32(8)) | (np.uint32(raw[o + 2]) << np.uint32(16))
            | (np.uint32(raw[o + 3]) << np.uint32(24)))


@njit(cache=True, inline="always")
def _i8(raw, o):
    v = np.int32(raw[o])
    return np.float32(v - ((v & 0x80) << 1))


@njit(cache=True, inline="always")
def _scale_min_k4(j, raw, s):
    """ggml's get_scale_min_k4: the j-th 6-bit scale and min of the 12 bytes at raw[s:]."""
    if j < 4:
        return np.int32(raw[s + j]) & 63, np.int32(raw[s + j + 4]) & 63
    a = np.int32(raw[s + j + 4])
    sc = (a & 0x0F) | ((np.int32(raw[s + j - 4]) >> 6) << 4)
    mn = (a >> 4) | ((np.int32(raw[s + j]) >> 6) << 4)
    return sc, mn


@njit(cache=True, inline="always")
def decode_block(fmt, raw, raw8, table, buf):
    """Write the values of the block in raw (its bytes, uint8) into buf (block_size float32),
    bit-identical to ggml's dequantisation where the caller is compiled without fastmath
    (same operations in the same order). raw8 is raw viewed as int8 (Q8_0's values).
    Callers pass slices, so every index here is a small constant plus the loop
    variable (measured 1.6x faster than offsets into the whole matrix)."""
    o = 0
    bo = 0
    # Loop bounds read from the buffer, not constants: a constant 16 or 32 made LLVM unroll
    # the loops fully and then leave them scalar (measured 2x slower).
    half = buf.shape[0] // 2
    if fmt <= 1:  # q4_0: (q - 8) * d ; q4_1: q * d + m
        d = _f16(raw, o, table)
        if fmt == 0:
            for j in range(half):
                v = np.int32(raw[o + 2 + j])
                buf[bo + j] = np.float32((v & 0x0F) - 8) * d
                buf[bo + j + half] = np.float32((v >> 4) - 8) * d
        else:
            m = _f16(raw, o + 2, table)
            for j in range(half):
                v = np.int32(raw[o + 4 + j])
                buf[bo + j] = np.float32(v & 0x0F) * d + m
                buf[bo + j + half] = np.float32(v >> 4) * d + m
    elif fmt <= 3:  # q5_0: (q - 16) * d ; q5_1: q * d + m ; bit 4 of element j is bit j of qh
        d = _f16(raw, o, table)
        m = np.float32(0.0) if fmt == 2 else _f16(raw, o + 2, table)
        off = 16 if fmt == 2 else 0
        h = o + 2 if fmt == 2 else o + 4
        qh = _u32(raw, h)
        for j in range(half):
            b = np.int32(raw[h + 4 + j])
            lo = ((b & 0x0F) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))) - off
            hi = ((b >> 4) | np.int32(((qh >> np.uint32(j + half)) & np.uint32(1)) << np.uint32(4))) - off
            if fmt == 2:
                buf[bo + j] = np.float32(lo) * d
                buf[bo + j + half] = np.float32(hi) * d
            else:
                buf[bo + j] = np.float32(lo) * d + m
                buf[bo + j + half] = np.float32(hi) * d + m
    elif fmt == 4:  # q8_0: int8 * d
        d = _f16(raw, o, table)
        for j in range(2 * half):
            buf[bo + j] = np.float32(raw8[o + 2 + j]) * d
    elif fmt == 5 or fmt == 6:  # q4_k / q5_k: 8 sub-blocks of 32, each with a 6-bit scale and min
        d = _f16(raw, o, table)
        dmin = _f16(raw, o + 2, table)
        ql = o + 16 if fmt == 5 else o + 48
        for g in range(4):
            sc1, m1 = _scale_min_k4(2 * g, raw, o + 4)
            sc2, m2 = _scale_min_k4(2 * g + 1, raw, o + 4)
            d1 = d * np.float32(sc1)
            d2 = d * np.float32(sc2)
            n1 = dmin * np.float32(m1)
            n2 = dmin * np.float32(m2)
            base = 64 * g
            for j in range(32):
                b = np.int32(raw[ql + 32 * g + j])
                lo = b & 0x0F
                hi = b >> 4
                if fmt == 6:
                    h = np.int32(raw[o + 16 + j])
                    lo |= ((h >> (2 * g)) & 1) << 4
                    hi |= ((h >> (2 * g + 1)) & 1) << 4
                buf[bo + base + j] = d1 * np.float32(lo) - n1
                buf[bo + base + 32 + j] = d2 * np.float32(hi) - n2
    else:  # fmt 7, q6_k: 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high in qh
        d = _f16(raw, o + 208, table)
        for half in range(2):
            ql = o + 64 * half
            qh = o + 128 + 32 * half
            sc = o + 192 + 8 * half
            base = 128 * half
            for j in range(32):
                s = j // 16
                a = np.int32(raw[ql + j])
                c = np.int32(raw[ql + j + 32])
                h = np.int32(raw[qh + j])
                q1 = ((a & 0x0F) | ((h & 3) << 4)) - 32
                q2 = ((c & 0x0F) | (((h >> 2) & 3) << 4)) - 32
                q3 = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32
                q4 = ((c >> 4) | (((h >> 6) & 3) << 4)) - 32
                buf[bo + base + j] = d * _i8(raw, sc + s) * np.float32(q1)
                buf[bo + base + j + 32] = d * _i8(raw, sc + s + 2) * np.float32(q2)
                buf[bo + base + j + 64] = d * _i8(raw, sc + s + 4) * np.float32(q3)
                buf[bo + base + j + 96] = d * _i8(raw, sc + s + 6) * np.float32(q4)


@njit(cache=True)
def dequant_rows_blocks(fmt, block_size, block_bytes, raw, rows, k, table, out):
    """out (len(rows), k) float32: the listed rows of the block matrix in raw (embedding lookups,
    and tiles of rows for the matrix-matrix path). One thread (see cpu_matmul.py)."""
    blocks = k // block_size
    row_bytes = blocks * block_bytes
    raw8 = raw.view(np.int8)
    for i in range(rows.shape[0]):
        r = rows[i]
        row = out[i]
        for b in range(blocks):
            o = r * row_bytes + b * block_bytes
            decode_block(fmt, raw[o:o + block_bytes], raw8[o:o + block_bytes], table,
                         row[b * block_size:(b + 1) * block_size])


@njit(cache=True, parallel=True, fastmath=True)
def f16_matmul(w, x, table, out):
    """out (m, n) = x (m, k) float32 times the transpose of w (n, k) given as f16 bit patterns (uint16)."""
    n, k = w.shape
    m = x.shape[0]
    for r in prange(n):
        for i in range(m):
            s = np.float32(0.0)
            for j in range(k):
                s += table[w[r, j]] * x[i, j]
            out[i, r] = s
