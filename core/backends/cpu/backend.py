"""The numpy backend: storage is a flat numpy array; layouts become strided views.

f16 and bf16 are stored in two bytes (bf16 as its uint16 bit pattern) and
computed in f32, rounding back after every op (round-to-nearest-even).
"""
import math
import mmap
import os
import weakref

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...dtypes import bf16, bool_, f16, f32, i64
from ...errors import ShapeError, UnsupportedError
from ...layout import numel_of
from .runtime import kernel_calls  # (pure Python until the kernels are asked for: they load then)
from ...settings import settings
from . import attention, float_steps
from .kernels.codes import BINARY_CODES
from .runtime import blas_rows, capture, reused_arrays
from ..base import Backend
from ..operand import QuantWeight, parts
from ..step_recording import StepCapture


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _erf(x):
    # Vectorised erf with float64 accuracy (math.erf per element is too slow).
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:
        return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(x.dtype)


def _gelu(x):
    # float32: gelu's rational erf (numba or numpy), far faster than scipy's.
    from .gelu import gelu
    y = gelu(x)
    return y if y is not None else (0.5 * x * (1.0 + _erf(x * np.float32(1 / math.sqrt(2))))).astype(x.dtype)


_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "expm1": np.expm1, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "sigmoid": lambda x: np.exp(-np.logaddexp(0, -x)).astype(x.dtype),
    "relu": lambda x: np.maximum(x, 0), "square": np.square,
    "reciprocal": lambda x: 1.0 / x, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "sign": np.sign, "logical_not": np.logical_not,
    "gelu": _gelu,
    "gelu_tanh": lambda x: (0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2 / math.pi))
                                                     * (x + np.float32(0.044715) * x * x * x)))).astype(x.dtype),
    "silu": lambda x: (x / (1.0 + np.exp(-x))).astype(x.dtype),
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
}
_NP_DTYPES: dict[str, object] = {}
_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
            "gt": np.greater, "ge": np.greater_equal}


class _DequantCache:
    """f32 copies of quantised weights, kept while they fit a memory budget.

    Without numba (numpy only), measured (bench/quant.py, 49152x576, one token): a
    kept f32 copy multiplies in 12-14 ms, dequantising in chunks per call takes
    90-230 ms. So weights are dequantised once and kept, up to $TALLOW_QUANT_CACHE_MB
    (default: a quarter of physical memory, at most 4 GiB); past the budget the
    per-call chunked path keeps memory bounded. 0 disables it.
    With numba installed, the formats its kernels handle (backends/cpu/runtime/kernel_calls.py) keep no
    copies unless $TALLOW_QUANT_CACHE_MB is set: the integer-dot kernels decode as fast
    as the copies (SmolLM2, bench/llm.py) in a third of the memory. Not even the largest,
    the tied Q8_0 output head: its copy saves 0.4 ms of a ~42 ms token (3.4 vs 3.8 ms,
    one thread) for 108 MB.
    """

    def __init__(self):
        self.entries = {}  # id(storage) -> (weakref to storage, f32 array)
        self.used = 0
        self.budget = None

    def budget_bytes(self, kernels):
        mb = settings().quant_cache_mb  # asked each time: tests and benchmarks change it at run time
        if mb is not None:
            return int(mb * 2**20)
        if kernels:  # the kernels compute on the blocks: copies only when asked for
            return 0
        if self.budget is None:
            try:
                phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                phys = 8 * 2**30
            self.budget = min(phys // 4, 4 * 2**30)
        return self.budget

    def get(self, w, wdtype, n, k, kernels=False):
        """The f32 copy of w, made now if it fits the budget; None past it. kernels: the numba
        kernels handle wdtype (then the default budget is 0)."""
        key = id(w)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is w:
            return hit[1]
        size = n * k * 4
        if self.used + size > self.budget_bytes(kernels):
            return None
        from ...quant import dequantize_numpy
        wf = dequantize_numpy(w, wdtype, n * k).reshape(n, k)
        self.entries[key] = (weakref.ref(w, lambda _r, key=key, size=size: self._drop(key, size)), wf)
        self.used += size
        return wf

    def _drop(self, key, size):
        if self.entries.pop(key, None) is not None:
            self.used -= size


_DEQUANT_CACHE = _DequantCache()
_NO_VECTOR = np.empty(0, np.float32)  # "no weight/bias" for the decode kernels
_NO_TABLE = np.empty((0, 0), np.float32)  # "no rotary tables" for cache_attention
_ZEROS = np.empty(0, np.float32)  # add_norm_linear's stand-in for "no residual"
# Query rows per head up to which attention runs as the decode kernel (a decoding step, or GQA's
# query heads sharing a KV head); longer prompts take BLAS's matrix products.
DECODE_ATTENTION_MAX_ROWS = 8
# Keys up to which it beats numpy's BLAS path (measured per call, 64-wide heads: 3x3 query rows over
# 100 keys 20 vs 29 us, over 1000 keys 111 vs 132 us; Whisper's 6 heads over 1500 encoder keys 101 vs 79 us).
DECODE_ATTENTION_MAX_KEYS = 1024


_GATE_ROWS_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}  # fused_ops.gate_rows' (codes.ACT_CODES)


def _decode_kernels(dtype):
    """backends/cpu/kernels/fused_ops.py for float32 operands once numba's CPU kernels are in use (a
    quantised model loaded them), else None."""
    if dtype is not f32:
        return None
    return kernel_calls.decode_kernels()


def _batch_kernels(dtype):
    """backends/cpu/kernels/batch_attention.py where _decode_kernels gives fused_ops, else None."""
    return None if _decode_kernels(dtype) is None else kernel_calls.batch_kernels()


def _cache_table(caches, positions, key_starts):
    """batch_attention's table of the rows' caches (address, address, capacity, position, key
    start), or None when a row's caches are not whole writable arrays, or its keys are more than
    the single step's kernel takes (NumpyBackend.cache_attention's conditions)."""
    rows = []
    for ((kc, lkc), (vc, lvc)), position, key_start in zip(caches, positions, key_starts):
        if (position + 1 - key_start > DECODE_ATTENTION_MAX_KEYS or not _whole(kc, lkc) or not _whole(vc, lvc)
                or not (kc.flags.writeable and vc.flags.writeable)):
            return None
        rows.append((kc.ctypes.data, vc.ctypes.data, lkc.shape[2], position, key_start))
    return np.array(rows, np.int64)


def _whole(st, layout):
    """True when the layout covers the whole storage in order (no view needed)."""
    if layout.offset or not layout.is_contiguous():
        return False
    shape = layout.shape
    return len(st) == (shape[0] if len(shape) == 1 else numel_of(shape))


# dtypes numpy computes in directly, and binary ops that need no error-state handling
_NATIVE = frozenset(("f32", "f64", "i8", "u8", "i32", "i64", "u32", "bool"))
_PLAIN = frozenset(("add", "sub", "mul", "maximum", "minimum"))


def _step_program(calls):
    """A captured step's calls as one program for every thread (runtime/step_program.py, kernels/step_loop.py),
    or None (TALLOW_CPU=replay, or a call it does not know: the calls replay one by one)."""
    if settings().cpu == "replay":
        return None
    from .runtime import step_program
    return step_program.build(calls)


class NumpyBackend(StepCapture, Backend):
    name = "cpu"
    driver = capture.CpuDriver(_step_program)

    def __init__(self):
        self._captures = {}

    def features(self):
        return {"backend": "numpy", "numpy": np.__version__, "f16": True, "bf16": True,
                "quant_kernels": kernel_calls.kernel_status()}

    # ---- capture and replay (tallow.capture): StepCapture, with capture's driver -------
    entry_signature = staticmethod(capture.entry_signature)
    _new_step_buffer = staticmethod(capture.step_new_buffer)

    def can_capture(self):
        """Once the numba kernels are in use (a quantised model loaded them): their decode path is
        what a capture records (capture.py)."""
        return kernel_calls.decode_kernels() is not None

    def captures_windows(self):
        """cache_attention records a one-query step's window as key_start -window, which the replay
        (capture.cache_attention, step_loop's attention) turns into max(0, position + 1 - window)."""
        return True

    def _recorder(self):
        """A capture.Recorder while this thread captures, else None."""
        rec = self._capture() if self._captures else None
        return None if rec is None else capture.Recorder(rec)

    def overwrite(self, storage, data, dtype):
        src = self.from_bytes(data, dtype)
        if src.size > storage.size:
            raise ShapeError(f"cpu overwrite: {len(data)} bytes do not fit a {storage.nbytes}-byte storage")
        storage[:src.size] = src

    # ---- views and conversion ----------------------------------------------
    @staticmethod
    def view(st, layout):
        """The layout as a numpy view of the storage (no copy)."""
        off = layout.offset
        if layout.is_contiguous():
            shape = layout.shape
            n = numel_of(shape)
            return (st if off == 0 and len(st) == n else st[off:off + n]).reshape(shape)
        n = layout.numel()
        if n == 0:
            return np.empty(layout.shape, st.dtype)
        return as_strided(st[off:], layout.shape, [s * st.itemsize for s in layout.strides], writeable=False)

    def load(self, st, layout, dtype):
        """A view in compute precision: f16/bf16 -> f32."""
        v = self.view(st, layout)
        if dtype is bf16:
            return _bf16_to_f32(v)
        if dtype is f16:
            return v.astype(np.float32)
        return v

    def to_numpy(self, st, layout, dtype, copy=True):
        """A copy, or with copy=False a read-only view of the storage (bf16 is always converted)."""
        v = _bf16_to_f32(self.view(st, layout)) if dtype is bf16 else self.view(st, layout)
        if copy:
            return np.array(v, copy=True)
        v = v.view()
        v.flags.writeable = False
        return v

    @staticmethod
    def store(x, dtype):
        """Flat contiguous storage of x in dtype."""
        if dtype is bf16:
            return _f32_to_bf16(x).reshape(-1)
        npdt = _NP_DTYPES.get(dtype.np_name) or _NP_DTYPES.setdefault(dtype.np_name, np.dtype(dtype.np_name))
        if type(x) is np.ndarray and x.dtype == npdt and x.flags.c_contiguous:
            return x.reshape(-1)
        return np.ascontiguousarray(x, dtype=npdt).reshape(-1)

    # ---- memory -------------------------------------------------------------
    def from_bytes(self, data, dtype):
        # Zero-copy over memoryviews (memory-mapped weights stay in the page cache);
        # immutable bytes are copied so the tensor can be written to.
        if dtype.is_quantized:
            arr = np.frombuffer(data, dtype=np.uint8)
        else:
            self._check_whole_elements(memoryview(data).nbytes, dtype)
            arr = np.frombuffer(data, dtype=np.dtype(dtype.np_name).newbyteorder("<")).astype(dtype.np_name, copy=False)
        return arr.copy() if isinstance(data, bytes) else arr

    def to_bytes(self, st, layout, dtype):
        if dtype.is_quantized:
            return st.tobytes()
        return np.ascontiguousarray(self.view(st, layout)).astype(np.dtype(dtype.np_name).newbyteorder("<"),
                                                                  copy=False).tobytes()

    def from_list(self, values, dtype):
        if dtype is bf16:
            return _f32_to_bf16(np.asarray(values, dtype=np.float32))
        return np.asarray(values, dtype=dtype.np_name).reshape(-1)

    def to_list(self, st, layout, dtype):
        return self.load(st, layout, dtype).reshape(-1).tolist()

    def full(self, numel, value, dtype):
        if value == 0 and math.copysign(1.0, value) > 0:
            return _zeros(numel, np.dtype(np.uint16 if dtype is bf16 else dtype.np_name))
        if dtype is bf16:
            return np.full(numel, _f32_to_bf16(np.float32(value)).item(), np.uint16)
        return np.full(numel, value, dtype.np_name)

    def arange(self, start, step, numel, dtype):
        if dtype.is_float:
            return self.store(start + step * np.arange(numel, dtype=np.float64), dtype)
        return (start + step * np.arange(numel, dtype=np.int64)).astype(dtype.np_name)

    def concat_rows(self, parts, dtype):
        """Quantised matrices joined along their rows (q/k/v, gate/up at load time). Parts that
        lie side by side in one memory-mapped file (GGUF writes ffn_gate then ffn_up) join as a
        view of the mapping, so joining costs no memory; others are copied once, and the mapped
        pages the copy read are handed back (mapped_pages.py)."""
        if not dtype.is_quantized:
            return super().concat_rows(parts, dtype)
        arrays = [st for st, _ in parts]
        joined = _adjacent_view(arrays)
        if joined is not None:
            return joined
        joined = np.concatenate(arrays)
        from .mapped_pages import release_copied
        release_copied(arrays)  # the file pages just read for the copy are not read again
        return joined

    # ---- element-wise -------------------------------------------------------
    def copy(self, st, layout, dtype):
        v = self.view(st, layout)
        # one copy (ascontiguousarray then .copy() made two of a strided view: an encoder's heads
        # split, 15% of the q8_0 Whisper encoder's time), into reused memory when it is large
        out = reused_arrays.empty(v.shape) if v.dtype == np.float32 else np.empty(v.shape, v.dtype)
        np.copyto(out, v)
        return out.reshape(-1)

    def assign(self, dst, ld, src, ls, dtype):
        n = ld.numel()
        if n == 0:
            return
        if not dst.flags.writeable:
            raise UnsupportedError("this tensor's memory is read-only (memory-mapped from a file); "
                                   "clone() it before writing")
        if ld.is_contiguous():
            target = dst[ld.offset:ld.offset + n].reshape(ld.shape)
        else:
            target = as_strided(dst[ld.offset:], ld.shape, [s * dst.itemsize for s in ld.strides])
        target[...] = self.view(src, ls)

    def cast(self, st, layout, src, dst):
        x = self.load(st, layout, src)
        if dst.kind in "iu" and src.is_float:
            x = np.trunc(x)
        if dst is bool_:
            x = x != 0
        return self.store(x, dst)

    def unary(self, op, st, layout, dtype, arg=None):
        rec = self._recorder()
        if op == "gelu" and dtype is f32 and _whole(st, layout) and _decode_kernels(dtype) is not None:
            return float_steps.gelu(st, rec)  # (one kernel call, recorded: a float step's MLP)
        if rec is not None:
            rec.refuse(f"{op} off the kernels")
        if arg is None and dtype.name in ("f32", "f64") and _whole(st, layout):
            return _UNARY[op](st)  # fast path: the whole flat storage
        x = self.load(st, layout, dtype)
        if op == "clamp":
            lo, hi = arg
            y = np.clip(x, lo, hi) if lo is not None or hi is not None else x
        elif op == "pow_scalar":
            y = np.power(x, arg)
        elif op == "affine":
            y = x * arg[0] + arg[1]
        else:
            y = _UNARY[op](x)
        return self.store(y, bool_ if op == "logical_not" else dtype)

    def _gate(self, y, m, n, dtype, act):
        """act(gate) * up over the (m, 2n) product y ([gate | up] per row) in one kernel call for
        every gate activation (fused_ops.gate_rows): as numpy passes, Gemma 3's gelu_tanh took ~18%
        of its 64-token prompt (py-spy, 2 threads)."""
        code = _GATE_ROWS_ACTS.get(act)
        dec = _decode_kernels(dtype)
        if (code is None or dec is None or not isinstance(y, np.ndarray) or y.dtype != np.float32
                or y.size != 2 * m * n or not y.flags.c_contiguous):
            return super()._gate(y, m, n, dtype, act)
        out = np.empty((m, n), np.float32)
        y2 = y.reshape(m, 2 * n)
        dec.gate_rows(y2, code, out)
        rec = self._recorder()
        if rec is not None:  # (a float model's captured step: the same kernel, so the same bits)
            rec(dec.gate_rows, rec.bound(y2, y, "a gate's input"), code, out)
        return out.reshape(-1)

    def binary(self, op, a, la, b, lb, dtype):
        rec = self._recorder()
        if rec is not None and op in BINARY_CODES and dtype is f32 and a.dtype == np.float32 == b.dtype \
                and _whole(a, la) and (b.size == 1 or _whole(b, lb) and b.size == a.size) and _decode_kernels(dtype):
            # inside a capture (a residual add, Gemma's embedding scale): a kernel the step replays
            out = np.empty(a.shape, np.float32)
            args = (a.reshape(-1), b.reshape(-1), BINARY_CODES[op], out.reshape(-1))
            _decode_kernels(dtype).binary_f32(*args)
            rec(_decode_kernels(dtype).binary_f32, *args)
            return out
        if rec is not None:
            rec.refuse(f"binary {op} (not recorded on the cpu device)")
        if dtype.name in _NATIVE and op in _PLAIN and _whole(a, la) and _whole(b, lb):
            if a.dtype == np.float32 == b.dtype and a.size == b.size:  # (a residual add: reused memory)
                return _BINARY[op](a, b, out=reused_arrays.empty(a.shape))
            return _BINARY[op](a, b)  # fast path: both operands are whole flat storages
        x, y = self.load(a, la, dtype), self.load(b, lb, dtype)
        if op in ("div", "pow"):  # inf/nan results are the answer, not a warning
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return self.store(_BINARY[op](x, y), dtype)
        return self.store(_BINARY[op](x, y), dtype)

    def compare(self, op, a, la, b, lb, dtype):
        return self.store(_COMPARE[op](self.load(a, la, dtype), self.load(b, lb, dtype)), bool_)

    def where(self, cond, a, b, dtype):
        (c, lc), (a, la), (b, lb) = cond, a, b
        return self.store(np.where(self.view(c, lc), self.load(a, la, dtype), self.load(b, lb, dtype)), dtype)

    # ---- reductions -----------------------------------------------------------
    def reduce(self, op, st, layout, dtype, dims):
        x = self.load(st, layout, dtype)
        if op in ("argmax", "argmin"):
            (d,) = dims
            if x.shape[d] == 0:
                raise ShapeError(f"{op} over an empty dim {d} of shape {x.shape}")
            return self.store((np.argmax if op == "argmax" else np.argmin)(x, axis=d), i64)
        if op in ("max", "min"):
            if any(x.shape[d] == 0 for d in dims):
                raise ShapeError(f"{op} over an empty dim of shape {x.shape}")
            return self.store((np.max if op == "max" else np.min)(x, axis=dims), dtype)
        out = i64 if dtype.kind in "iub" else dtype
        fn = np.sum if op == "sum" else np.prod
        return self.store(fn(x, axis=dims, dtype=np.int64 if out is i64 else None), out)

    def cumsum(self, st, layout, dtype, dim):
        out = i64 if dtype.kind in "iub" else dtype
        return self.store(np.cumsum(self.load(st, layout, dtype), axis=dim), out)

    # ---- linear algebra and indexing ------------------------------------------
    def matmul(self, a, b, dtype):
        y = self._float_step_product(a, b, None, dtype)
        if y is not None:
            return y
        (a, la), (b, lb) = a, b
        return self.store(_product(self.load(a, la, dtype), self.load(b, lb, dtype)), dtype)

    def matmul_bias(self, a, b, bias, dtype):
        y = self._float_step_product(a, b, bias, dtype)
        if y is not None:
            return y
        if dtype is not f32 or len(a.layout.shape) != 2:
            return super().matmul_bias(a, b, bias, dtype)
        y = _product(self.load(*a, dtype), self.load(*b, dtype))
        y += self.view(*bias)  # in place on the product's own new array
        return self.store(y, dtype)

    def _float_step_product(self, a, b, bias, dtype):
        """A decoding step's product by a float32 matrix stored exactly in f16, on the kernels
        (float_steps.py), or None; inside a capture None refuses the step."""
        rec = self._recorder()
        y = None
        if _decode_kernels(dtype) is not None:
            (a, la), (b, lb) = a, b
            bv = None if bias is None else self.view(*bias)
            y = float_steps.product(self.view(a, la), b, lb, bv, rec)
        if y is None and rec is not None:
            rec.refuse("a float product off the f16 kernel")
        return None if y is None else y.reshape(-1)

    def qmatmul(self, x, w, dtype):
        (x, lx), (w, wdtype, n, k) = x, w
        rec = self._recorder()
        if self._decode_product(lx, dtype, w, wdtype, k):  # the integer-dot kernels on the blocks, as below
            return self.store(kernel_calls.qmatmul(self.view(x, lx), w, wdtype, n, k, record=rec), dtype)
        if rec is not None:
            rec.refuse("a quantised product off the decode kernels")
        xv = self.load(x, lx, dtype).astype(np.float32, copy=False)
        kernels = kernel_calls.supports(wdtype)
        # With the numba kernels: the mapped blocks, unless $TALLOW_QUANT_CACHE_MB asks for copies.
        # Without: an f32 copy while it fits the budget, else numpy's chunked path.
        wf = _DEQUANT_CACHE.get(w, wdtype, n, k, kernels)
        if wf is not None:
            if xv.size == k:  # one row: matrix-vector path (see matmul)
                return self.store(np.matmul(wf, xv.reshape(k)), dtype)
            return self.store(np.matmul(xv, wf.T), dtype)
        if kernels:
            return self.store(kernel_calls.qmatmul(xv, w, wdtype, n, k), dtype)
        from ...quant import qmatmul_numpy
        return self.store(qmatmul_numpy(xv, w, wdtype, n, k), dtype)

    def dequantize(self, w, wdtype, numel, dtype):
        from ...quant import dequantize_numpy
        return self.store(dequantize_numpy(w, wdtype, numel), dtype)

    def index_select(self, x, ids, dtype, dim):
        (st, layout), (ids, lids) = x, ids
        idx = self.view(ids, lids)
        rec = self._recorder()
        if dtype.is_quantized and kernel_calls.supports(dtype):
            if rec is not None:
                rec.bound(idx, ids, "an embedding lookup's ids")
            return self.store(kernel_calls.dequant_rows(st, dtype, layout.shape[1], idx, record=rec), f32)
        if rec is not None or (dim == 0 and _decode_kernels(dtype) is not None):
            rows = None if dim or _decode_kernels(dtype) is None else \
                float_steps.take_rows(self.view(st, layout), idx, rec)
            if rows is not None:
                if rec is not None:
                    rec.bound(idx, ids, "an embedding lookup's ids")
                return rows.reshape(-1)
            if rec is not None:
                rec.refuse("index_select off the decode kernels")
        if dtype.is_quantized:
            from ...quant import dequantize_rows_numpy
            return self.store(dequantize_rows_numpy(st, dtype, layout.shape[1], idx), f32)
        return self.store(np.take(self.view(st, layout), idx, axis=dim), dtype)

    def gather(self, x, ids, dtype, dim):
        (st, layout), (ids, lids) = x, ids
        idx = self.view(ids, lids).astype(np.int64)
        # As torch: the index may be shorter than the input in the other dims (take_along_axis wants them equal).
        src = self.view(st, layout)[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(idx.shape))]
        return self.store(np.take_along_axis(src, idx, axis=dim), dtype)

    def scatter_add(self, dst, ids, src, dtype, dim):
        (dst, ld), (ids, lids), (src, ls) = dst, ids, src
        out = np.array(self.load(dst, ld, dtype), copy=True)
        idx = self.view(ids, lids).astype(np.int64)
        values = self.load(src, ls, dtype)
        # Full open-mesh index so repeated indices accumulate (np.add.at).
        grid = list(np.indices(idx.shape, sparse=True))
        grid[dim] = idx
        np.add.at(out, tuple(grid), values)
        return self.store(out, dtype)

    def conv1d(self, x, w, dtype, spec):
        return self._conv(self.load(*x, dtype), self.load(*w, dtype), dtype, (spec.stride,), (spec.padding,),
                          (spec.dilation,), spec.groups)

    def conv2d(self, x, w, dtype, spec):
        return self._conv(self.load(*x, dtype), self.load(*w, dtype), dtype, spec.stride, spec.padding, spec.dilation,
                          spec.groups)

    def _conv(self, x, w, dtype, stride, padding, dilation, groups):
        if len(stride) == 1 and groups == 1 and dilation == (1,) and x.dtype == np.float32 == w.dtype:
            return self.store(_conv1d_rows(x, w, stride[0], padding[0]), dtype)
        # im2col over any number of spatial dims, then one matmul per group.
        nd = len(stride)
        x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
        b, cin = x.shape[:2]
        cout, cin_g = w.shape[:2]
        ks = w.shape[2:]
        outs = [(x.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
        xs = x.strides
        view = as_strided(
            x, (b, cin, *outs, *ks),
            (xs[0], xs[1], *[xs[2 + i] * stride[i] for i in range(nd)], *[xs[2 + i] * dilation[i] for i in range(nd)]),
            writeable=False,
        )
        view = view.reshape(b, groups, cin_g, *outs, *ks)
        wg = w.reshape(groups, cout // groups, cin_g, *ks)
        letters = "uvw"[:nd]
        kl = "xyz"[:nd]
        spec = f"bgc{letters}{kl},goc{kl}->bgo{letters}"
        y = np.einsum(spec, view, wg, optimize=True)
        return self.store(y.reshape(b, cout, *outs), dtype)

    # ---- fused ------------------------------------------------------------------
    def softmax(self, st, layout, dtype, log=False):
        x = self.load(st, layout, dtype)
        m = np.max(x, axis=-1, keepdims=True) if x.shape[-1] else x
        z = x - m
        if log:
            y = z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
        else:
            e = np.exp(z)
            y = e / np.sum(e, axis=-1, keepdims=True)
        return self.store(y, dtype)

    def layer_norm(self, x, w, b, dtype, eps):
        (x, lx), (w, lw), (b, lb) = x, parts(w), parts(b)
        v = self.load(x, lx, dtype)
        if dtype is f32 and v.ndim >= 2 and v.shape[-1] and w is not None and b is not None:
            return self.store(_layer_norm_rows(v, self.view(w, lw), self.view(b, lb), eps), dtype)
        mean = v.mean(axis=-1, keepdims=True)
        c = v - mean
        y = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
        if w is not None:
            y = y * self.load(w, lw, dtype)
        if b is not None:
            y = y + self.load(b, lb, dtype)
        return self.store(y, dtype)

    def rms_norm(self, x, w, dtype, eps):
        (x, lx), (w, lw) = x, parts(w)
        dec = _decode_kernels(dtype)
        if dec is not None and lx.shape and lx.shape[-1] and (w is None or w.dtype == np.float32):
            # the fused kernel (sums in float64): recorded inside a capture (Gemma's q/k norms per head
            # and its norms after attention and the MLP), so the step replays
            view = self.view(x, lx)
            xv = np.ascontiguousarray(view.reshape(-1, lx.shape[-1]))
            wv = self._vector(w, lw)
            if wv.ndim == 1 and wv.flags.c_contiguous and wv.shape[0] in (0, xv.shape[1]):
                normed = np.empty(xv.shape, np.float32)
                args = (xv, wv, float(eps), normed)
                dec.rms_norm(*args)
                rec = self._recorder()
                if rec is not None:
                    rec.bound(xv, x, "a norm's input")
                    rec(dec.rms_norm, *args)
                return normed.reshape(-1)
        rec = self._recorder()
        if rec is not None:
            rec.refuse("rms_norm (not recorded on the cpu device)")
        v = self.load(x, lx, dtype)
        y = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps)
        if w is not None:
            y = y * self.load(w, lw, dtype)
        return self.store(y, dtype)

    def rope(self, x, rotary, dtype):
        v = self.load(*x, dtype)
        c, s = self.load(*rotary.cos, dtype), self.load(*rotary.sin, dtype)
        if rotary.interleaved:
            x1, x2 = v[..., 0::2], v[..., 1::2]
            out = np.empty_like(v)
            out[..., 0::2] = x1 * c - x2 * s
            out[..., 1::2] = x1 * s + x2 * c
        else:
            h = v.shape[-1] // 2
            x1, x2 = v[..., :h], v[..., h:]
            out = np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
        return self.store(out, dtype)

    def attention(self, q, k, v, mask, dtype, spec):
        (q, lq), (k, lk), (v, lv), (mask, lmask) = q, k, v, parts(mask)
        scale, causal = spec.scale, spec.causal
        rec = self._recorder()
        if mask is None and not causal and lq.shape[2] <= DECODE_ATTENTION_MAX_ROWS and _decode_kernels(dtype):
            # a few queries over every key (a decoder's cross-attention over the audio)
            views = [self.view(st, lay) for st, lay in ((q, lq), (k, lk), (v, lv))]
            y = float_steps.cross_attention(*views, scale, rec)
            if y is not None:
                if rec is not None:
                    rec.bound(views[0], q, "an attention's queries")
                return y.reshape(-1)
        if rec is not None:
            rec.refuse("attention off the cross-attention kernel")
        few = (mask is None and lq.shape[2] <= DECODE_ATTENTION_MAX_ROWS and lk.shape[2] <= DECODE_ATTENTION_MAX_KEYS
               and lk.strides[3] == lv.strides[3] == 1)
        dec = _decode_kernels(dtype) if few else None
        if dec is not None:  # a decoding step: one pass over the cache per query row
            out = np.empty(lq.shape[:3] + lv.shape[3:], np.float32)
            dec.attention(np.ascontiguousarray(self.view(q, lq)), k, lk.offset, np.array(lk.strides[:3]), v,
                          lv.offset, np.array(lv.strides[:3]), np.array((lk.shape[1], lk.shape[2], lv.shape[3])),
                          np.float32(scale), bool(causal), out)
            return out.reshape(-1)
        qv, kv, vv = self.load(q, lq, dtype), self.load(k, lk, dtype), self.load(v, lv, dtype)
        if qv.shape[-2] >= attention.MIN_QUERIES and kv.shape[-2]:
            # many queries (an encoder, a prompt): blocked so the scores stay in cache
            m = None if mask is None else self.load(mask, lmask, dtype)
            return self.store(attention.attention(qv, kv, vv, m, scale, causal), dtype)
        # Scale q (tq*d values) rather than the scores (tq*tk), and work in place on the
        # one (b, h, tq, tk) temporary: the encoder's 1500x1500 scores dominate its time.
        scores = np.matmul(qv * np.asarray(scale, qv.dtype), np.swapaxes(kv, -1, -2))
        if mask is not None:
            scores += self.load(mask, lmask, dtype)
        tq, tk = scores.shape[-2], scores.shape[-1]
        if causal:
            banned = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
            scores[..., banned] = -np.inf
        if tk:
            scores -= np.max(scores, axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= np.sum(scores, axis=-1, keepdims=True)
        return self.store(np.matmul(scores, vv), dtype)

    # ---- fused decode ops: one numba call each when the CPU kernels are installed -----------
    # (backends/cpu/kernels/fused_ops.py); otherwise, and for other dtypes, base.py's compositions.
    def add_rms_norm(self, x, r, w, dtype, eps):
        dec = _decode_kernels(dtype)
        if dec is None:
            return super().add_rms_norm(x, r, w, dtype, eps)
        (x, lx), (r, lr), (w, lw) = x, r, parts(w)
        xv, rv, total, normed = self._norm_operands(x, lx, r, lr)
        args = (xv, rv, self._vector(w, lw), float(eps), total, normed)
        dec.add_rms_norm(*args)
        rec = self._recorder()
        if rec is not None:
            self._record_norm(rec, dec.add_rms_norm, args, x, r)
        return total.reshape(-1), normed.reshape(-1)

    def add_layer_norm(self, x, r, w, b, dtype, eps):
        dec = _decode_kernels(dtype)
        if dec is None:
            return super().add_layer_norm(x, r, w, b, dtype, eps)
        (x, lx), (r, lr), (w, lw), (b, lb) = x, r, parts(w), parts(b)
        xv, rv, total, normed = self._norm_operands(x, lx, r, lr)
        args = (xv, rv, self._vector(w, lw), self._vector(b, lb), float(eps), total, normed)
        dec.add_layer_norm(*args)
        rec = self._recorder()
        if rec is not None:
            self._record_norm(rec, dec.add_layer_norm, args, x, r)
        return total.reshape(-1), normed.reshape(-1)

    def add_norm_linear(self, x, r, norm, linear, dtype):
        # A decoding step on the kernels: the norm kernel's output array goes straight into the
        # integer-dot product (base.py's composition stores it, then views and checks it again).
        # The first layer has no residual: the add kernel adds zeros (exact), so that step is
        # recorded like the others.
        k = x.layout.shape[-1]
        dec = _decode_kernels(dtype)
        act, gated, qw = linear.act, linear.gated, linear.weight
        if (dec is None or (act is not None and not gated) or not isinstance(qw, QuantWeight)
                or not self._decode_product(x.layout, dtype, qw.storage, qw.dtype, k)):
            return super().add_norm_linear(x, r, norm, linear, dtype)
        (x, lx), (r, lr), (w, wdtype, rows, _) = x, parts(r), qw
        (nw, lnw), (nb, lnb), eps = parts(norm.weight), parts(norm.bias), norm.eps
        bias = linear.bias
        xv, rv, total, normed = self._norm_operands(x, lx, r, lr)
        if rv is None:
            r, rv = _ZEROS, np.zeros(xv.shape, np.float32)
        if norm.center:
            kernel, args = dec.add_layer_norm, (xv, rv, self._vector(nw, lnw), self._vector(nb, lnb), float(eps),
                                                total, normed)
        else:
            kernel, args = dec.add_rms_norm, (xv, rv, self._vector(nw, lnw), float(eps), total, normed)
        kernel(*args)
        rec = self._recorder()
        if rec is not None:
            self._record_norm(rec, kernel, args, x, r)
        if gated:
            y = kernel_calls.gated_qmatmul(normed, w, wdtype, rows // 2, k, act, record=rec)
        elif bias is None:
            y = kernel_calls.qmatmul(normed, w, wdtype, rows, k, record=rec)
        else:
            y = kernel_calls.qmatmul_bias(normed, w, wdtype, rows, k, self.view(*bias), record=rec)
        return None if r is _ZEROS else total.reshape(-1), y.reshape(-1)

    @staticmethod
    def _record_norm(rec, kernel, args, x, r):
        """A norm kernel's call in a capture: its inputs args[0], args[1] must be x's and r's memory."""
        rec.bound(args[0], x, "a norm's input")
        if r is not _ZEROS:
            rec.bound(args[1], r, "a norm's residual")
        rec(kernel, *args)

    def _norm_operands(self, x, lx, r, lr):
        d = lx.shape[-1] if lx.shape else 1
        xv = self.view(x, lx).reshape(-1, d)
        rv = None if r is None else self.view(r, lr).reshape(-1, d)
        return xv, rv, np.empty(xv.shape, np.float32), np.empty(xv.shape, np.float32)

    def _vector(self, st, layout):
        return _NO_VECTOR if st is None else self.view(st, layout)

    def qmatmul_bias(self, x, w, bias, dtype):
        if not self._decode_product(x.layout, dtype, w.storage, w.dtype, w.cols):
            if dtype is not f32:
                return super().qmatmul_bias(x, w, bias, dtype)
            y = self.qmatmul(x, w, dtype)  # a new array of its own: the bias goes in in place
            y.reshape(-1, w.rows)[...] += self.view(*bias)
            return y
        return self.store(kernel_calls.qmatmul_bias(self.view(*x), *w, self.view(*bias), record=self._recorder()),
                          dtype)

    def gated_qmatmul(self, x, w, dtype, act):
        if not self._decode_product(x.layout, dtype, w.storage, w.dtype, w.cols):
            return super().gated_qmatmul(x, w, dtype, act)
        return self.store(kernel_calls.gated_qmatmul(self.view(*x), w.storage, w.dtype, w.rows // 2, w.cols, act,
                                                     record=self._recorder()), dtype)

    def batch_rows(self, wdtype, dtype):
        """The integer-dot kernels compute each of up to FUSED_MAX_ROWS rows of x exactly as they
        compute that row alone (vector_ir's tile_dot sums each row's blocks in dot's order);
        BLAS's products (float weights, TALLOW_CPU=numpy, more rows) may sum in another order."""
        if dtype is f32 and wdtype.is_quantized and kernel_calls.supports(wdtype) \
                and _DEQUANT_CACHE.budget_bytes(True) == 0:
            return kernel_calls.FUSED_MAX_ROWS
        return 1

    @staticmethod
    def _decode_product(lx, dtype, w, wdtype, k):
        """True when a quantised product is a decoding step for the integer-dot kernels: f32 x
        of few rows, a format they handle, and no f32 copy of w asked for ($TALLOW_QUANT_CACHE_MB)."""
        if dtype is not f32 or not k or lx.numel() // k > kernel_calls.FUSED_MAX_ROWS:
            return False
        if not (kernel_calls.supports(wdtype) and _DEQUANT_CACHE.budget_bytes(True) == 0):
            return False
        reused_arrays.release()  # a decoding step: the prompt's large results kept for reuse go
        return True

    def kv_write(self, k, v, slots, dtype):
        dec = _decode_kernels(dtype)
        if dec is None:
            return super().kv_write(k, v, slots, dtype)
        dec.kv_write(self.view(*k), self.view(*v), self._target(*slots.keys), self._target(*slots.values))

    def rope_kv_write(self, qkv, rotary, slots, dtype):
        dec = _decode_kernels(dtype)
        if dec is None:
            return super().rope_kv_write(qkv, rotary, slots, dtype)
        q, k, v = qkv
        q_out = np.empty(q.layout.shape, np.float32)
        dec.rope_kv_write(self.view(*q), self.view(*k), self.view(*v), self.view(*rotary.cos), self.view(*rotary.sin),
                          self._target(*slots.keys), self._target(*slots.values), q_out, bool(rotary.interleaved))
        return q_out.reshape(-1)

    def cache_attention(self, qkv, cache, rotary, mask, dtype, spec):
        # A decoding step over whole contiguous caches: rotation, cache write and attention as one
        # kernel call (base.py's composition makes 2 kernel calls and 5 numpy views: ~30 us a layer).
        dec = _decode_kernels(dtype)
        (q, lq), (k, lk), (v, lv) = qkv
        (kc, lkc), (vc, lvc) = cache
        position, key_start, scale = spec.position, spec.key_start, spec.scale
        t = lq.shape[2]
        if (dec is None or mask is not None or t > DECODE_ATTENTION_MAX_ROWS
                or position + t - key_start > DECODE_ATTENTION_MAX_KEYS or not _whole(kc, lkc) or not _whole(vc, lvc)
                or not (kc.flags.writeable and vc.flags.writeable)):
            return super().cache_attention(qkv, cache, rotary, mask, dtype, spec)
        (cos, lcos), (sin, lsin) = ((None, None), (None, None)) if rotary is None else rotary[:2]
        interleaved = rotary is not None and rotary.interleaved
        out = np.empty(lq.shape[:3] + lvc.shape[3:], np.float32)
        table = (self.view(cos, lcos), self.view(sin, lsin)) if cos is not None else (_NO_TABLE, _NO_TABLE)
        # a few rows (a short prompt) arrive as strided views: copied, so numba loads one version
        qkv = tuple(np.ascontiguousarray(self.view(st, lay)) for st, lay in ((q, lq), (k, lk), (v, lv)))
        caches = (kc.reshape(lkc.shape), vc.reshape(lvc.shape))
        dec.cache_attention(*qkv, *table, *caches, position, key_start, np.float32(scale), bool(interleaved), out)
        rec = self._recorder()
        if rec is not None:
            for view, st in zip(qkv, (q, k, v)):
                rec.bound(view, st, "an attention input")
            whole = (_NO_TABLE, _NO_TABLE, 0) if cos is None else _whole_tables(cos, lcos, sin, lsin, position)
            if whole is None:
                rec.refuse("rotary tables that are not rows of one table")
            else:
                # a sliding window's first key moves with the position: recorded as -window (capture.py)
                keys = key_start if spec.window is None else -spec.window
                rec(capture.cache_attention, dec.cache_attention, rec.recording.step, whole[2], *qkv, whole[0],
                    whole[1], *caches, keys, np.float32(scale), bool(interleaved), out)
        return out.reshape(-1)

    def batch_cache_attention(self, qkv, caches, rotary, dtype, spec):
        # A batched decoding step: every row's fused_ops.cache_attention in one kernel call over a
        # table of the rows' caches (one op a layer where the rows' own ops cost ~100 us each).
        # A row the single step would not run on that kernel sends the batch row by row (base.py).
        dec = _batch_kernels(dtype)
        table = None if dec is None else _cache_table(caches, spec.positions, spec.key_starts)
        if table is None:
            return super().batch_cache_attention(qkv, caches, rotary, dtype, spec)
        q, _, v = qkv
        out = np.empty(q.layout.shape[:3] + v.layout.shape[3:], np.float32)
        rows = (_NO_TABLE, _NO_TABLE) if rotary is None else \
            (np.ascontiguousarray(self.view(*rotary.cos)), np.ascontiguousarray(self.view(*rotary.sin)))
        interleaved = rotary is not None and rotary.interleaved
        arrays = tuple(np.ascontiguousarray(self.view(*op)) for op in qkv)
        dec.batch_cache_attention(*arrays, *rows, table, np.float32(spec.scale), bool(interleaved), out)
        return out.reshape(-1)

    def _target(self, st, layout):
        """A writable numpy view of the layout (a KV cache's slots), as assign writes through."""
        if not st.flags.writeable:
            raise UnsupportedError("this tensor's memory is read-only (memory-mapped from a file); "
                                   "clone() it before writing")
        return as_strided(st[layout.offset:], layout.shape, [s * st.itemsize for s in layout.strides])

    def custom(self, op, inputs, out_shape, out_dtype):
        y = np.asarray(op.cpu(*[self.load(st, lay, dt) for st, lay, dt in inputs]))
        if y.shape != tuple(out_shape):
            raise ShapeError(f"custom op {op.name!r}: cpu() returned shape {y.shape}, "
                             f"output_shape() said {tuple(out_shape)}")
        return self.store(y, out_dtype)


def _product(x, w):
    """x @ w for loaded operands: one row by BLAS's matrix-vector path (np.matmul would take the
    matrix-matrix one: measured 3x the CPU time per token with 2 threads), many rows split among
    threads (blas_rows.py)."""
    if x.ndim == 2 and x.shape[0] == 1:
        return np.matmul(w.T, x[0])
    if x.ndim == 2 and w.ndim == 2:
        return blas_rows.matmul(x, w)
    return np.matmul(x, w)


def _layer_norm_rows(v, w, b, eps):
    """LayerNorm over v's last axis (population variance) with few temporaries: the encoder's
    (1500, 384) rows 13 -> ~4 ms a call."""
    c = np.subtract(v, v.mean(axis=-1, keepdims=True), out=reused_arrays.empty(v.shape))
    var = np.einsum("...j,...j->...", c, c)[..., None]
    var *= np.float32(1.0 / v.shape[-1])
    var += np.float32(eps)
    c /= np.sqrt(var)
    c *= w
    c += b
    return c


def _conv1d_rows(x, w, stride, pad):
    """conv1d of x (b, cin, frames) by w (cout, cin, k) as one product per batch row over an
    im2col matrix of k consecutive frames of every channel (time-major), then the (frames, cout)
    result transposed back: the einsum path below took 3x as long on Whisper's convolutions."""
    b, cin, frames = x.shape
    cout, _, k = w.shape
    wt = np.ascontiguousarray(w.transpose(0, 2, 1).reshape(cout, k * cin)).T  # (k * cin, cout)
    n = (frames + 2 * pad - k) // stride + 1
    out = np.empty((b, cout, n), np.float32)
    for i in range(b):
        xp = np.zeros((frames + 2 * pad, cin), np.float32)
        xp[pad:pad + frames] = x[i].T
        rows = as_strided(xp, (n, k * cin), (xp.strides[0] * stride, 4), writeable=False)
        out[i] = _product(np.ascontiguousarray(rows), wt).T
    return out


LAZY_ZEROS_BYTES = 1 << 17


def _zeros(numel, dt):
    """numel zeros; from LAZY_ZEROS_BYTES up in pages of their own, mapped only when first written
    (a KV cache's unused positions cost no memory). calloc gives that only while glibc's mmap
    threshold is low, and freeing a prompt's 4 MB tiles raises it: a SmolLM2 run then kept every
    page of its 256-position caches resident (+7 MB, measured)."""
    nbytes = numel * dt.itemsize
    if nbytes >= LAZY_ZEROS_BYTES and _PRIVATE_MAP is not None:
        try:
            return np.frombuffer(mmap.mmap(-1, nbytes, flags=_PRIVATE_MAP), dt, count=numel)
        except (OSError, ValueError):  # out of maps: calloc
            pass
    return np.zeros(numel, dt)


# Private (Python's default for mmap(-1) is shared: a forked child would write the parent's cache);
# None where there are no such maps (Windows, Pyodide): calloc then.
_PRIVATE_MAP = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS") else None)


def _whole_tables(cos, lcos, sin, lsin, position):
    """(cos table, sin table, row of `position` less position) when the step's rotary rows are
    contiguous rows of one (rows, width) table each, at the same row, else None."""
    w = lcos.shape[-1] if lcos.shape else 0
    if (not w or lcos.shape != lsin.shape or lcos.offset != lsin.offset or not lcos.is_contiguous()
            or not lsin.is_contiguous() or lcos.offset % w or cos.size % w or sin.size % w):
        return None
    return cos.reshape(-1, w), sin.reshape(-1, w), lcos.offset // w - position


def _adjacent_view(arrays):
    """One read-only uint8 view over `arrays` when they are consecutive byte ranges of the
    same exported buffer (a memory map), else None."""
    owners = [a.base.obj if isinstance(a.base, memoryview) else None for a in arrays]
    if owners[0] is None or any(o is not owners[0] for o in owners):
        return None
    whole = np.frombuffer(owners[0], np.uint8)
    origin = whole.__array_interface__["data"][0]
    start = arrays[0].__array_interface__["data"][0] - origin
    at = start
    for a in arrays:
        if a.__array_interface__["data"][0] - origin != at or not a.flags.c_contiguous:
            return None
        at += a.nbytes
    return whole[start:at]


# Inside a capture the compute primitives the CPU decode path does not record make the step
# unreplayable (capture.py); the recorded ones mark their own other paths.
capture.guard_unrecorded(NumpyBackend, ("qmatmul", "qmatmul_bias", "gated_qmatmul", "index_select",
                                            "add_rms_norm", "add_norm_linear", "cache_attention", "matmul",
                                            "matmul_bias", "unary", "attention", "add_layer_norm", "rms_norm",
                                            "binary"))
