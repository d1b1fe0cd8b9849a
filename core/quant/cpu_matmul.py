"""The CPU device's quantised matmul and embedding lookup on GGUF blocks, through
the numba kernels in cpu_kernels.py, with the argument checks done here.

`kernels()` is the module when it can be used: numba installed and
$TALLOW_CPU_KERNELS not "0". Otherwise None, and the numpy backend keeps its
dequantise-with-numpy path.

Few rows of x (a decoding step) are quantised to 16 bits in blocks of 32 and
multiplied by integer dot products on the blocks (cpu_int_kernels.py, as ggml
does with 8 bits; why 16 is explained there), which read each weight byte once.
Many rows (a prompt) are multiplied by BLAS a tile of weight rows at a time,
each tile dequantised by a kernel into one reused f32 buffer: BLAS's
matrix-matrix product is far faster than any loop here, and the tile
keeps memory bounded. That dequantisation runs on one thread: the kernels'
OpenMP threads spin after each call, and alternating them with BLAS's threads
on the same cores starved both (measured: first token 5.0 s instead of 1.3 s).
"""
import os

from ..errors import FormatError, ShapeError
from .formats import quant_dtype

FUSED_MAX_ROWS = 8  # rows of x up to which the fused kernel beats dequantise-then-BLAS (measured)
ACTIVATION_MAX = 32767  # decoding steps quantise x to int16 (see cpu_int_kernels.py)
TILE_ELEMENTS = 1 << 18  # f32 elements of a dequantised tile (1 MB: stays in L2)

_state: dict[str, object] = {}


def kernels():
    """The cpu_kernels module, or None when numba is missing or TALLOW_CPU_KERNELS=0."""
    if os.environ.get("TALLOW_CPU_KERNELS", "1") == "0":
        return None
    if "module" not in _state:
        # One thread count for BLAS and the kernels: numba reads this when it is first imported.
        if os.environ.get("OMP_NUM_THREADS", "").isdigit() and "NUMBA_NUM_THREADS" not in os.environ:
            os.environ["NUMBA_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        try:
            from . import cpu_int_kernels, cpu_kernels
        except ImportError:
            cpu_kernels = cpu_int_kernels = None
        _state["module"] = cpu_kernels
        _state["int"] = cpu_int_kernels
    return _state["module"]


def supports(qtype):
    """True when the kernels compute on this format directly (the others keep the numpy path)."""
    mod = kernels()
    return mod is not None and quant_dtype(qtype).name in mod.FORMATS


def _blocks(raw, d, n, k):
    import numpy as np
    if k % d.block_size:
        raise ShapeError(f"{d.name} matmul: row length k={k} is not a multiple of the block size {d.block_size}")
    arr = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    arr = arr.reshape(-1).view(np.uint8)
    need = n * (k // d.block_size) * d.block_bytes
    if arr.size != need:
        raise FormatError(f"{d.name}: {n} rows of {k} need {need} bytes, got {arr.size}")
    return arr


def qmatmul(x, raw, qtype, n, k):
    """x (..., k) float32 times the transpose of the quantised (n, k) matrix in raw -> (..., n) float32."""
    import numpy as np
    mod = kernels()
    d = quant_dtype(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (k,):
        raise ShapeError(f"{d.name} matmul: x has shape {x.shape}, expected last dim {k}")
    arr = _blocks(raw, d, n, k)
    fmt = mod.FORMATS[d.name]
    x2 = np.ascontiguousarray(x.reshape(-1, k))
    m = x2.shape[0]
    if m <= FUSED_MAX_ROWS:
        ints = _state["int"]
        qx = np.empty((m, k), dtype=np.int16)
        dx = np.empty((m, k // ints.QK), dtype=np.float32)
        sx = np.empty((m, k // ints.QK), dtype=np.int32)
        ints.quantize_rows(x2, ACTIVATION_MAX, qx, dx, sx)
        out = np.empty((m, n), dtype=np.float32)
        ints.qmatmul_q(fmt, d.block_size, d.block_bytes, arr, qx, dx, sx, n, mod.F16_TABLE, out, ints.QK // 2)
        return out.reshape(x.shape[:-1] + (n,))
    # out is filled transposed, so each tile writes whole contiguous rows (BLAS's fast path)
    out_t = np.empty((n, m), dtype=np.float32)
    step = max(1, min(n, TILE_ELEMENTS // k))
    tile = np.empty((step, k), dtype=np.float32)
    for start in range(0, n, step):
        rows = np.arange(start, min(n, start + step), dtype=np.int64)
        w = tile[:rows.size]
        mod.dequant_rows_blocks(fmt, d.block_size, d.block_bytes, arr, rows, k, mod.F16_TABLE, w)
        np.matmul(w, x2.T, out=out_t[start:start + rows.size])
    return np.ascontiguousarray(out_t.T).reshape(x.shape[:-1] + (n,))


def dequant_rows(raw, qtype, k, row_ids):
    """(len(row_ids), k) float32: the listed rows of a block matrix of rows of k (an embedding lookup)."""
    import numpy as np
    from .dequant_numpy import block_rows
    mod = kernels()
    d, rows, ids = block_rows(raw, qtype, k, row_ids)
    out = np.empty((ids.size, k), dtype=np.float32)
    mod.dequant_rows_blocks(mod.FORMATS[d.name], d.block_size, d.block_bytes, rows.reshape(-1), ids, k,
                            mod.F16_TABLE, out)
    return out


def f16_matmul(x, w_bits):
    """x (..., k) float32 times the transpose of w (n, k), given as f16 bit patterns (uint16 array)."""
    import numpy as np
    mod = kernels()
    n, k = w_bits.shape
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (k,):
        raise ShapeError(f"f16 matmul: x has shape {x.shape}, expected last dim {k}")
    x2 = np.ascontiguousarray(x.reshape(-1, k))
    out = np.empty((x2.shape[0], n), dtype=np.float32)
    mod.f16_matmul(np.ascontiguousarray(w_bits).view(np.uint16), x2, mod.F16_TABLE, out)
    return out.reshape(x.shape[:-1] + (n,))
