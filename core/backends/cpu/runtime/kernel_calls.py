"""The CPU device's quantised matmul and embedding lookup on GGUF blocks, through
the numba kernels in float_rows.py, with the argument checks done here.

`kernels()` is the module when it can be used: numba installed and
$TALLOW_CPU not "numpy" (tallow.settings). Otherwise None, and the numpy backend keeps its
dequantise-with-numpy path.

Few rows of x (a decoding step) are quantised to 16 bits in blocks of 32 and
multiplied by integer dot products on the blocks (int_dot.py, as ggml
does with 8 bits; why 16 is explained there), which read each weight byte once.
Many rows (a prompt) are multiplied by BLAS a tile of weight rows at a time,
each tile dequantised by a kernel into one reused f32 buffer: BLAS's
matrix-matrix product is far faster than any loop here, and the tile
keeps memory bounded. That dequantisation runs on one thread: BLAS's own
threads share the cores (measured with OpenMP kernel threads beside them: first
token 5.0 s instead of 1.3 s). Decoding-step products of at least
PARALLEL_MIN_BYTES of weights are shared among $TALLOW_THREADS threads (else
$OMP_NUM_THREADS, else one per core) by threads.RowPool.
"""
import threading

from ....errors import FormatError, ShapeError
from ....settings import settings
from ....quant.formats import quant_dtype

FUSED_MAX_ROWS = 8  # rows of x up to which the fused kernel beats dequantise-then-BLAS (measured)
# K-quants: a prompt of up to this many rows also runs on the integer kernels (byte dots, 4-row
# tiles): 3.3-4.7x less CPU than dequantise-then-BLAS on a 64-token prompt (docs/cpu-kernels.md)
KQUANT_FUSED_MAX_ROWS = 64
K_QUANTS = ("q4_k", "q5_k", "q6_k")
# A prompt's product of more than FUSED_MAX_ROWS and up to this many rows runs as integer GEMM tiles
# (activations quantised to int8 once), above it dequantise-then-BLAS: on K-quant matrices
# (TILE_MAX_ROWS, kernels/int_tiles.py; measured in docs/cpu-kernels.md), on q4_0 / q5_0 / q8_0
# (TILE_32_MAX_ROWS, kernels/int_tiles_32.py: 1.7-2.7x BLAS's speed at 64 rows, session 39) and on q4_1 /
# q5_1 (TILE_MIN_32_MAX_ROWS): 0, off, since int8 activations per 32 changed SmolLM2 Q4_1's greedy
# answer to "What is the capital of France?" against transformers (test_llm_models); those tiles stay tested
TILE_MAX_ROWS = 128
TILE_32_MAX_ROWS = 128
TILE_MIN_32_MAX_ROWS = 0
TILE_32_FORMATS = ("q4_0", "q5_0", "q8_0")  # int_tiles_32's formats
ACTIVATION_MAX = 32767  # decoding steps quantise x to int16 (see int_dot.py)
# Weight bytes from which a decoding-step product is shared among the threads (threads.py);
# smaller ones run on the calling thread, where handing out chunks costs about what it saves.
PARALLEL_MIN_BYTES = 1 << 18
FEW_PROMPT_ROWS = 32  # rows of x up to which a prompt's tile product runs as w x^T (see qmatmul)
TILE_ELEMENTS = 1 << 20  # f32 elements of a prompt's dequantised tile (4 MB: BLAS ran 1.4-1.7x faster than on 1 MB)

_state: dict[str, object] = {}


def thread_count():
    """Threads for the kernels: $TALLOW_THREADS, else $OMP_NUM_THREADS, else one per core."""
    return settings().threads


def kernels():
    """The float_rows names (machine_code.KernelModule), or None when numba is missing or
    TALLOW_CPU=numpy. Nothing here imports numba: with the kernels' machine code cached,
    a process never does (machine_code.py)."""
    if settings().cpu == "numpy":
        return None
    if "module" not in _state:
        import importlib.util
        if importlib.util.find_spec("numba") is None:
            _state["module"] = None
            return None
        import numpy as np

        from ..kernels import codes
        from ..kernels.machine_code import KernelModule
        _state["module"] = KernelModule("float_rows", FORMATS=codes.FORMATS, F16_TABLE=codes.F16_TABLE)
        _state["int"] = KernelModule("int_dot", QK=codes.QK, ACT_CODES=codes.ACT_CODES)
        _state["decode"] = KernelModule("fused_ops")
        _state["step"] = KernelModule("step_loop")
        _state["batch"] = KernelModule("batch_attention")
        _state["tiles"] = KernelModule("int_tiles")
        _state["tiles_32"] = KernelModule("int_tiles_32")
        _state["no_bias"] = np.empty(0, dtype=np.float32)
        from ..kernels import machine_code
        machine_code.load_all()  # before any weight is read: LLVM's page spike at low RSS (see there)
        set_threads(thread_count())
    return _state["module"]


def load_ahead(device, use=False):
    """Called as a model that runs the kernels on this device starts loading (a GGUF decoder,
    Whisper): on the CPU, link the kernels' machine code now, compiling it first where this
    machine has none yet, which says so on stderr at once (machine_code.py) rather than
    seconds later at the first product, after a silent wait. use=False: nothing else changes,
    kernels() still puts them to use where it did; use=True puts them to use now (a float model
    whose decoding steps run on them: Whisper's f16 products, captured steps)."""
    if str(device) != "cpu" or settings().cpu == "numpy" or "module" in _state:
        return
    if use:
        kernels()
        return
    import importlib.util
    if importlib.util.find_spec("numba") is None:
        return
    from ..kernels import machine_code
    machine_code.load_all()


def kernel_status():
    """Which quantised kernels this process runs, in words (for `tallow devices`); loads nothing."""
    import importlib.util
    if settings().cpu == "numpy":
        return "off (TALLOW_CPU=numpy): numpy with f32 copies"
    if importlib.util.find_spec("numba") is None:
        return "none: numpy with f32 copies (pip install 'tallow[cpu]' for kernels on the GGUF blocks)"
    from ..kernels import machine_code
    if not machine_code.enabled():
        return "numba's (TALLOW_CPU=numba or NUMBA_DISABLE_JIT=1)"
    failed = machine_code.errors()
    return "machine code compiled by numba, loaded without it" + (
        f"; numba's for {len(failed)}: {'; '.join(failed)}" if failed else "")


def int_kernels():
    """int_dot' names (quantize_rows, qmatmul_shared), once the kernels are in use."""
    return _state["int"]


def step_kernels():
    """step_loop's names (run_step), once the kernels are in use."""
    return _state["step"]


def set_threads(n):
    """Share the decoding-step products of at least PARALLEL_MIN_BYTES among n threads (1: the
    calling thread alone)."""
    from .threads import RowPool
    n = max(1, int(n))
    if n != _state.get("threads"):
        if _state.get("pool") is not None:
            _state["pool"].close()
        _state["threads"], _state["pool"] = n, RowPool(n) if n > 1 else None


def decode_kernels():
    """The fused decode kernels (fused_ops) once the kernels are in use, else None.
    They never load the kernels themselves: a quantised model has loaded them by its first
    product or embedding lookup, and Whisper on the CPU loads them as it loads (load_ahead with
    use=True); a float LLM does not."""
    if "module" not in _state:
        return None
    return _state["decode"] if kernels() is not None else None



def batch_kernels():
    """The batched decoding step's attention (batch_attention.py) where decode_kernels() is not None,
    but not under NUMBA_DISABLE_JIT=1 (its pointer intrinsics are compiled code only)."""
    if decode_kernels() is None:
        return None
    from ..kernels import machine_code
    return None if machine_code.jit_disabled() else _state["batch"]

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
    return read_only(arr)


def read_only(arr):
    """arr, or a read-only view of it: weights mapped from the file are read-only and copies
    (joined q/k/v) are not, and numba loads one machine-code version per flag (~15 ms each)."""
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def _operands(x, raw, qtype, n, k):
    """(format, its kernel code, x as contiguous (m, k) float32, the blocks as uint8), checked.
    Callers have checked supports() (so the kernels are loaded: no second look at the environment)."""
    import numpy as np
    d = quant_dtype(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (k,):
        raise ShapeError(f"{d.name} matmul: x has shape {x.shape}, expected last dim {k}")
    arr = _blocks(raw, d, n, k)
    return d, (_state.get("module") or kernels()).FORMATS[d.name], np.ascontiguousarray(x.reshape(-1, k)), arr


def qmatmul(x, raw, qtype, n, k, record=None):
    """x (..., k) float32 times the transpose of the quantised (n, k) matrix in raw -> (..., n) float32.
    record: None, or while capturing (core/backends/cpu/runtime/capture.py's Recorder) called as
    record(fn, *args) with each kernel call of a decoding step's product, in order, and
    record.refuse(what) where the call cannot be replayed."""
    import numpy as np
    d, fmt, x2, arr = _operands(x, raw, qtype, n, k)
    lead = np.shape(x)[:-1]
    m = x2.shape[0]
    if m <= FUSED_MAX_ROWS:
        return _int_product(x, x2, arr, d, fmt, n, k, record=record).reshape(lead + (n,))
    if record is not None:
        record.refuse(f"a quantised product of {m} rows (a prompt)")
    if m <= (TILE_MAX_ROWS if d.name in K_QUANTS else TILE_32_MAX_ROWS if d.name in TILE_32_FORMATS
             else TILE_MIN_32_MAX_ROWS):
        return _tile_product(x2, arr, d, fmt, n, k).reshape(lead + (n,))
    if d.name in K_QUANTS and m <= KQUANT_FUSED_MAX_ROWS:
        return _int_product(x, x2, arr, d, fmt, n, k).reshape(lead + (n,))
    from . import blas_rows
    mod = _state["module"]
    # each tile's product goes straight into its columns of out (BLAS takes the row stride): no
    # transposed copy, whose second (m, n) array was a prompt's largest temporary (Qwen2.5-0.5B's
    # gate/up: 5 MB); as fast or faster, measured on 64-128 rows
    from . import reused_arrays
    out = reused_arrays.empty((m, n))  # (an encoder's 1,500 rows: memory reused, not faulted in again)
    step = max(1, min(n, TILE_ELEMENTS // k))
    step = -(-n // -(-n // step))  # tiles of even size: a small ragged last tile runs BLAS slowly
    tile = _scratch(step * k).reshape(step, k)
    # a short prompt: w x^T with the tile as stored, then its transpose into out's columns (OpenBLAS
    # packs the whole tile for x w^T); per 30 SmolLM2 layers at 16 rows 182-192 -> 156-160 ms, a wash at 64
    few = m <= FEW_PROMPT_ROWS
    tile_out = np.empty((step, m), dtype=np.float32) if few else None
    for start in range(0, n, step):
        rows = np.arange(start, min(n, start + step), dtype=np.int64)
        w = tile[:rows.size]
        if few:  # one thread: sharing it slowed the prompt 1.5x (BLAS's own threads spin between calls)
            mod.dequant_rows_blocks(fmt, d.block_size, d.block_bytes, arr, rows, k, mod.F16_TABLE, w)
        else:  # BLAS at one thread per row range: the threads share the dequantisation too
            blas_rows.by_rows(rows.size, lambda lo, hi, rows=rows, w=w: mod.dequant_rows_blocks(
                fmt, d.block_size, d.block_bytes, arr, rows[lo:hi], k, mod.F16_TABLE, w[lo:hi]), m)
        if few:
            out[:, start:start + rows.size] = np.matmul(w, x2.T, out=tile_out[:rows.size]).T
        else:  # (an encoder's frames: split by rows among threads, BLAS at one thread each)
            blas_rows.matmul(x2, w.T, out=out[:, start:start + rows.size])
    return out.reshape(lead + (n,))


_tiles = threading.local()


def _scratch(n):
    """n float32 of this thread's tile buffer, kept between products: with large blocks mapped
    per allocation (tallow.settings.tune_process) a new tile would fault in 4 MB of fresh
    pages at every product of a prompt. (Thread-local: it goes with its thread.)"""
    import numpy as np
    buf = getattr(_tiles, "buf", None)
    if buf is None or buf.size < n:
        buf = _tiles.buf = np.empty(max(n, TILE_ELEMENTS), dtype=np.float32)
    return buf[:n]


def _int_product(x, x2, arr, d, fmt, n, k, bias=None, act=None, record=None):
    """The decoding-step product on the blocks: x2 (m, k; x as _operands made it) quantised to
    16 bits, then integer dots (int_dot.qmatmul_shared) -> (m, n); plus bias (n,), or with act
    the gated product of arr's 2n rows [gate; up]. One thread below PARALLEL_MIN_BYTES of weights.
    record: see qmatmul."""
    import numpy as np
    ints = _state["int"]
    m = x2.shape[0]
    _tiles.buf = None  # decoding now: the prompt's 4 MB tile buffer goes (a new prompt faults it in again)
    if record is not None and not np.may_share_memory(x2, x):
        record.refuse("a copy of a quantised product's input")  # a replay would read the stale copy
    qx = np.empty((m, k), dtype=np.int16)
    dx = np.empty((m, k // ints.QK), dtype=np.float32)
    sx = np.empty((m, k // ints.QK), dtype=np.int32)
    ints.quantize_rows(x2, ACTIVATION_MAX, qx, dx, sx)
    out = np.empty((m, n), dtype=np.float32)
    bias = _state["no_bias"] if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(n)
    args = (fmt, d.block_size, d.block_bytes, arr, qx, dx, sx, _state["module"].F16_TABLE, out, bias,
            act is not None, ints.ACT_CODES[act] if act is not None else 0)
    shared = arr.size >= PARALLEL_MIN_BYTES
    run_product(args, n, shared)
    if record is not None:
        record(ints.quantize_rows, x2, ACTIVATION_MAX, qx, dx, sx)
        record(run_product, args, n, shared)
    return out


def _tile_product(x2, arr, d, fmt, n, k):
    """A prompt's product on the blocks: x2 (m, k) quantised to int8 once, then integer GEMM tiles
    over the n weight rows (int_tiles_32's on q4_0 / q5_0 / q8_0, else int_tiles'), shared by the
    pool's threads -> (m, n)."""
    import numpy as np

    from . import reused_arrays  # (results from 1 MB, e.g. a 1.5B model's gate/up: not faulted in again each product)
    m = x2.shape[0]
    if d.name in TILE_32_FORMATS:
        tiles = _state["tiles_32"]
        nbp = (k // 32 + 3) // 4 * 4  # int_tiles_32.padded_blocks (as there: no numba import here)
        nbp += 4 if nbp % 16 == 12 else 0
        xp = _aligned_bytes(m, nbp * 32)
        dx = np.empty((m, nbp), dtype=np.float32)
        st = np.empty((m, nbp), dtype=np.int32)
        tiles.quantize_32(x2, fmt, xp, dx, st)
        out = reused_arrays.empty((m, n))
        args = (fmt, d.block_bytes, arr, xp, dx, st, _state["module"].F16_TABLE, out)
        kernel = tiles.tile32_shared
    else:
        tiles = _state["tiles"]
        group = 256 if d.block_size == 256 else 32
        qx = _aligned_bytes(m, k)
        dx = np.empty((m, k // group), dtype=np.float32)
        s32 = np.empty((m, k // 32), dtype=np.int32)
        s16 = np.empty((m, k // 16), dtype=np.int32)
        if group == 256:  # (the K-quant tiles read each block's values in their own order)
            tiles.quantize_k(x2, qx, dx, s32, s16)
        else:
            tiles.quantize_i8(x2, group, qx, dx, s32, s16)
        out = reused_arrays.empty((m, n))
        args = (fmt, d.block_bytes, arr, qx, dx, s32, s16, _state["module"].F16_TABLE, out)
        kernel = tiles.tile_shared
    pool = _state["pool"]
    if pool is not None:
        pool.run(kernel, args, n)
    else:
        kernel(*args, n, 1, np.zeros(2, dtype=np.int64))
    return out


def _aligned_bytes(m, k):
    """An uninitialised (m, k) uint8 array starting on a 64-byte boundary: the tiles' 64-byte loads
    each on one cache line (1.05-1.2x the tiles' speed, docs/cpu-kernels.md; numpy's start was 16 past one)."""
    import numpy as np
    buf = np.empty(m * k + 64, dtype=np.uint8)
    at = -buf.ctypes.data % 64
    return buf[at:at + m * k].reshape(m, k)


def run_product(args, n, shared):
    """int_dot.qmatmul_shared over the n output columns: shared by the pool's threads (the pool
    in force when called) for a product of at least PARALLEL_MIN_BYTES, else on this thread."""
    import numpy as np
    pool = _state["pool"]
    if shared and pool is not None:
        pool.run(_state["int"].qmatmul_shared, args, n)
    else:  # the same kernel on this thread alone (one numba load fewer than qmatmul_q: ~15 ms, 2 MB)
        _state["int"].qmatmul_shared(*args, n, 1, np.zeros(2, dtype=np.int64))


def qmatmul_bias(x, raw, qtype, n, k, bias, record=None):
    """A decoding step's (few rows, <= FUSED_MAX_ROWS) x . w.T + bias, the bias added in the kernel."""
    d, fmt, x2, arr = _operands(x, raw, qtype, n, k)
    return _int_product(x, x2, arr, d, fmt, n, k, bias=bias, record=record).reshape(x.shape[:-1] + (n,))


def gated_qmatmul(x, raw, qtype, n, k, act, record=None):
    """A decoding step's act(x . gate.T) * (x . up.T) for the [gate; up] block matrix of 2n rows
    of k in raw, gate and up rows read in one pass. x (few rows, ..., k) -> (..., n) float32."""
    d, fmt, x2, arr = _operands(x, raw, qtype, 2 * n, k)
    return _int_product(x, x2, arr, d, fmt, n, k, act=act, record=record).reshape(x.shape[:-1] + (n,))


def dequant_rows(raw, qtype, k, row_ids, record=None):
    """(len(row_ids), k) float32: the listed rows of a block matrix of rows of k (an embedding lookup).
    record: see qmatmul (a replay looks up the ids then in row_ids' memory, checked again)."""
    import numpy as np
    from ....quant.dequant_numpy import block_rows
    mod = kernels()
    d, rows, ids = block_rows(raw, qtype, k, row_ids)
    out = np.empty((ids.size, k), dtype=np.float32)
    args = (mod.FORMATS[d.name], d.block_size, d.block_bytes, read_only(rows.reshape(-1)), ids, k, mod.F16_TABLE, out)
    mod.dequant_rows_blocks(*args)
    if record is not None:
        if not np.may_share_memory(ids, row_ids):
            record.refuse("a copy of an embedding lookup's ids")
        record(checked_rows, rows.shape[0], args)
    return out


def checked_rows(n_rows, args):
    """dequant_rows_blocks(*args) after checking its ids (args[4]) against the table's n_rows: a
    replayed lookup's ids were written by Graph.replay, past the front end's check."""
    check_ids(args[4], n_rows)
    _state["module"].dequant_rows_blocks(*args)


def check_ids(ids, n_rows):
    from ....errors import IndexRangeError
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_rows:
            raise IndexRangeError(f"embedding: id {lo if lo < 0 else hi} is out of range for dim 0 of size "
                                  f"{n_rows} (valid: 0 to {n_rows - 1})")


def pool():
    """The thread pool the decoding-step products share (None: one thread)."""
    return _state.get("pool")


def threads():
    return _state.get("threads", 1)


def f16_matmul(x, w_bits, bias=None, record=None):
    """x (..., k) float32 times the transpose of w (n, k) given as f16 bit patterns (uint16,
    C-contiguous), plus bias (n,): float_rows.f16_matmul_shared, whose products of at least
    PARALLEL_MIN_BYTES the pool's threads share. Needs kernels(). record: see qmatmul."""
    import numpy as np
    n, k = w_bits.shape
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (k,):
        raise ShapeError(f"f16 matmul: x has shape {x.shape}, expected last dim {k}")
    if w_bits.dtype != np.uint16 or not w_bits.flags.c_contiguous:
        raise ShapeError(f"f16 matmul: the weights must be a C-contiguous uint16 array of f16 bits, not {w_bits.dtype}")
    x2 = np.ascontiguousarray(x.reshape(-1, k))
    if record is not None and not np.may_share_memory(x2, x):
        record.refuse("a copy of an f16 product's input")
    out = np.empty((x2.shape[0], n), dtype=np.float32)
    bias = _state["no_bias"] if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(n)
    args = (w_bits.reshape(-1).view(np.uint8), x2, out, bias)
    shared = w_bits.nbytes >= PARALLEL_MIN_BYTES
    run_f16_product(args, n, shared)
    if record is not None:
        record(run_f16_product, args, n, shared)
    return out.reshape(x.shape[:-1] + (n,))


def run_f16_product(args, n, shared):
    """float_rows.f16_matmul_shared over the n output columns: shared by the pool's threads for a
    product of at least PARALLEL_MIN_BYTES, else on this thread (as run_product)."""
    import numpy as np
    kernel = _state["module"].f16_matmul_shared
    pool = _state["pool"]
    if shared and pool is not None:
        pool.run(kernel, args, n)
    else:
        kernel(*args, n, 1, np.zeros(2, dtype=np.int64))


def cross_attention(q, kc, vc, scale, record=None):
    """softmax(q k^T * scale) v for q (b, h, t, d) over every key of kc (bk, h, tk, d), vc
    (bk, h, tk, dv), all C-contiguous float32, bk b or 1 (one audio for every row): fused_ops's
    cross_attention_rows over all b * h heads. record: see qmatmul."""
    import numpy as np
    b, h, t, _d = q.shape
    out = np.empty((b, h, t, vc.shape[3]), dtype=np.float32)
    args = (q, kc, vc, np.float32(scale), out)
    run_cross_attention(args)
    if record is not None:
        record(run_cross_attention, args)
    return out


def run_cross_attention(args):
    q = args[0]
    _state["decode"].cross_attention_rows(*args, 0, q.shape[0] * q.shape[1])


def take_rows(table, ids, record=None):
    """(len(ids), k) float32: the listed rows of the float32 table (n, k), ids checked first (a
    replay checks them again: Graph.replay writes them past the front end's check)."""
    import numpy as np
    check_ids(ids, table.shape[0])
    out = np.empty((ids.size, table.shape[1]), dtype=np.float32)
    _state["module"].take_rows(table, ids, out)
    if record is not None:
        record(check_ids, ids, table.shape[0])
        record(_state["module"].take_rows, table, ids, out)
    return out
