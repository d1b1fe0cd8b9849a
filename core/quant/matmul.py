"""Quantised matmul: y = x @ dequant(w).T with w given as GGUF blocks, n rows of k.

numpy: the weights are dequantised a chunk of rows at a time (about 2 MB of
float32 per chunk) and multiplied into the matching output columns, so memory
stays bounded by the chunk rather than by the f32 size of the matrix
(bench/quant.py measures this against a cached f32 copy).
pure Python: rows are dequantised in small groups and dotted with each row of
x using C-level sum(map(mul, ...)) (math.sumprod on Python >= 3.12).
"""
import math
import operator
from array import array

from ..errors import FormatError, ShapeError
from .dequant_numpy import DECODERS as _NP_DECODERS
from .dequant_python import DECODERS as _PY_DECODERS, _as_bytes
from .formats import quant_dtype

CHUNK_ELEMENTS = 1 << 19  # float32 elements of w dequantised at once by the numpy path


def _row_bytes(d, n, k, nbytes):
    if k % d.block_size:
        raise ShapeError(f"{d.name} matmul: row length k={k} is not a multiple of the block size {d.block_size}")
    row_bytes = k // d.block_size * d.block_bytes
    if nbytes != n * row_bytes:
        raise FormatError(f"{d.name} matmul: {n} rows of {k} need {n * row_bytes} bytes, got {nbytes}")
    return row_bytes


def qmatmul_numpy(x, raw, qtype, n, k):
    """x (..., k) float32 times the transpose of the quantised (n, k) matrix in raw -> (..., n) float32."""
    import numpy as np
    d = quant_dtype(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (k,):
        raise ShapeError(f"{d.name} matmul: x has shape {x.shape}, expected last dim {k}")
    raw = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    raw = raw.reshape(-1).view(np.uint8)
    row_bytes = _row_bytes(d, n, k, raw.size)
    rows = raw.reshape(n, row_bytes)
    out = np.empty(x.shape[:-1] + (n,), dtype=np.float32)
    step = max(1, CHUNK_ELEMENTS // k)
    decode = _NP_DECODERS[d.name]
    with np.errstate(all="ignore"):
        for start in range(0, n, step):
            w = decode(rows[start:start + step].reshape(-1, d.block_bytes)).reshape(-1, k)
            np.matmul(x, w.T, out=out[..., start:start + step])
    return out


_sumprod = getattr(math, "sumprod", None) or (lambda a, b: sum(map(operator.mul, a, b)))
_ROWS_PER_DECODE = 16  # amortises the per-call setup of the pure-Python decoders


def qmatmul_python(x_flat, raw, qtype, n, k):
    """array('f') of m*n from x_flat (m*k floats, row-major) times the transpose of
    the quantised (n, k) matrix in raw."""
    d = quant_dtype(qtype)
    if len(x_flat) % k:
        raise ShapeError(f"{d.name} matmul: x has {len(x_flat)} elements, not a whole number of rows of {k}")
    m = len(x_flat) // k
    data = _as_bytes(raw)
    row_bytes = _row_bytes(d, n, k, len(data))
    xs = [x_flat[i * k:(i + 1) * k] for i in range(m)]
    out = array("f", bytes(4 * m * n))
    decode = _PY_DECODERS[d.name]
    blocks_per_row = k // d.block_size
    for start in range(0, n, _ROWS_PER_DECODE):
        count = min(_ROWS_PER_DECODE, n - start)
        w = decode(data[start * row_bytes:(start + count) * row_bytes], count * blocks_per_row)
        for r in range(count):
            wr = w[r * k:(r + 1) * k]
            for i, xr in enumerate(xs):
                out[i * n + start + r] = _sumprod(xr, wr)
    return out
