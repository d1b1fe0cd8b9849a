"""numba kernels that decode GGUF blocks to float32 on the CPU device: embedding rows,
tiles of weight rows for the prompt path (then multiplied by BLAS), and products with f16
matrices (vector_ir.f16_dot: each weight widened by the CPU's own instruction); and the rows
of a float32 table (a float model's embedding lookup in a captured step).
Decoding steps use the integer dot products of int_dot.py instead.

Imported only by the numpy backend, and only when numba is installed
(`pip install 'tallow[cpu]'`): `import tallow` never imports numba.

Each weight row is a run of GGUF blocks. `vector_ir.dequant_row` turns a row's blocks
into float32 values, bit-identical to ggml's `dequantize_row_*` (see dequant_numpy.py),
as vector IR: the same quant unpacking as the integer-dot kernels. NUMBA_DISABLE_JIT=1
runs dequant_numpy in its place.
"""

from .numba_setup import prepare

prepare()  # before any kernel loads: numba then does not import scipy's BLAS (numba_setup.py)
from numba import njit  # noqa: E402

from . import atomics, int_dot, vector_ir  # noqa: E402
from .codes import F16_TABLE, FORMATS, entry  # noqa: E402,F401 -- (callers read them here too)


@entry("i64", "i64", "i64", "u8[1]", "i64[1]", "i64", "f32[1]", "f32[2]")
@njit(cache=True)
def dequant_rows_blocks(fmt, block_size, block_bytes, raw, rows, k, table, out):
    """out (len(rows), k) float32 (C-contiguous): the listed rows of the block matrix in raw
    (embedding lookups, and tiles of rows for the matrix-matrix path), bit-identical to ggml,
    by vector_ir.dequant_row's vector IR: a 64-token SmolLM2 prompt's tiles took 105 ms through
    scalar numba loops, 38 ms here (measured). One thread (see kernel_calls.py)."""
    blocks = k // block_size
    row_bytes = blocks * block_bytes
    flat = out.reshape(-1)
    for i in range(rows.shape[0]):
        vector_ir.dequant_row(fmt, raw, rows[i] * row_bytes, blocks, block_bytes, table, flat, i * k)


@entry("f32[2]", "i64[1]", "f32[2]", step=True)
@njit(cache=True)
def take_rows(table, rows, out):
    """out (len(rows), k) = the listed rows of the float32 table (n, k): a float embedding lookup,
    which a captured step replays (its caller checks the ids against n first)."""
    for i in range(rows.shape[0]):
        out[i, :] = table[rows[i]]


@njit(cache=True, nogil=True)
def f16_rows(raw, x, out, bias, start, stop):
    """Columns start ... stop - 1 of out (m, n) = x (m, k) float32 times the transpose of the
    (n, k) f16 matrix in raw (its bytes, uint8), plus bias (n,) unless empty. Each weight row is
    read once for all m rows of x."""
    m, k = x.shape
    row_bytes = 2 * k
    for r in range(start, stop, 2):
        r2 = min(r + 1, stop - 1)  # (a last odd row twice)
        for i in range(m):
            y, y2 = vector_ir.f16_dot(raw, r * row_bytes, r2 * row_bytes, k, x, i)
            int_dot._store(out, i, r, r2, y, y2, bias, False, 0)


@entry("u8[1]", "f32[2]", "f32[2]", "f32[1]", "i64", "i64", "i64[1]", returns="bool")
@njit(cache=True, nogil=True)
def f16_matmul_shared(raw, x, out, bias, n_rows, chunks, state):
    """f16_rows over chunks of range(n_rows) that every thread calling this takes from state[0]
    (threads.RowPool, as int_dot.qmatmul_shared); True in the thread that finished
    the last one."""
    last = False
    while True:
        c = atomics.fetch_add(state, 0, 1)
        if c >= chunks:
            return last
        f16_rows(raw, x, out, bias, n_rows * c // chunks, n_rows * (c + 1) // chunks)
        if atomics.fetch_add(state, 1, 1) == chunks - 1:
            last = True
