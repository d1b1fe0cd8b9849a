"""numba kernels that decode GGUF blocks to float32 on the CPU device: embedding rows,
tiles of weight rows for the prompt path (then multiplied by BLAS), and the f16 matmul.
Decoding steps use the integer dot products of cpu_int_kernels.py instead.

Imported only by the numpy backend, and only when numba is installed
(`pip install 'tallow[cpu]'`): `import tallow` never imports numba.

Each weight row is a run of GGUF blocks. `cpu_simd.dequant_row` turns a row's blocks
into float32 values, bit-identical to ggml's `dequantize_row_*` (see dequant_numpy.py),
as vector IR: the same quant unpacking as the integer-dot kernels. NUMBA_DISABLE_JIT=1
runs dequant_numpy in its place.
"""
import numpy as np

from .numba_setup import prepare

prepare()  # before any kernel loads: numba then does not import scipy's BLAS (numba_setup.py)
from numba import njit, prange  # noqa: E402

from . import cpu_simd  # noqa: E402
from .kernel_codes import F16_TABLE, FORMATS  # noqa: E402,F401 -- (callers read them here too)


@njit(cache=True)
def dequant_rows_blocks(fmt, block_size, block_bytes, raw, rows, k, table, out):
    """out (len(rows), k) float32 (C-contiguous): the listed rows of the block matrix in raw
    (embedding lookups, and tiles of rows for the matrix-matrix path), bit-identical to ggml,
    by cpu_simd.dequant_row's vector IR: a 64-token SmolLM2 prompt's tiles took 105 ms through
    scalar numba loops, 38 ms here (measured). One thread (see cpu_matmul.py)."""
    blocks = k // block_size
    row_bytes = blocks * block_bytes
    flat = out.reshape(-1)
    for i in range(rows.shape[0]):
        cpu_simd.dequant_row(fmt, raw, rows[i] * row_bytes, blocks, block_bytes, table, flat, i * k)


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
