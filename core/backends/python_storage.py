"""Storage helpers of the pure-Python backend: reading a layout, packing results.

Storage is an `array.array` with the dtype's typecode. f16 and bf16 live in an
'f' array holding values already rounded to their precision, so reading them
is free and every op result goes through `pack`, which rounds (round to
nearest even) and wraps integers to their width like numpy does.
Only the standard library is used: this runs inside Pyodide without numpy.
"""
import struct
import sys
from array import array

from ..dtypes import bf16, bool_, f16
from ..layout import coalesce_dims

_BIG_ENDIAN = sys.byteorder == "big"
# A 4-byte unsigned typecode to reinterpret f32 bits (bf16 rounding).
_U32 = "I" if array("I").itemsize == 4 else "L"
_INT_RANGE: dict[str, tuple[int, int, int]] = {}  # dtype name -> (lo, hi, modulus)


def int_range(dtype):
    r = _INT_RANGE.get(dtype.name)
    if r is None:
        bits = dtype.itemsize * 8
        if dtype.kind == "i":
            r = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1, 1 << bits)
        else:
            r = (0, (1 << bits) - 1, 1 << bits)
        _INT_RANGE[dtype.name] = r
    return r


def wrap_ints(values, dtype):
    """Integers reduced to the dtype's width (two's complement), as numpy wraps."""
    lo, _, mod = int_range(dtype)
    return [(v - lo) % mod + lo for v in values]


# ---- rounding of floats --------------------------------------------------------
def _f16_one(x):
    try:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError:  # beyond the largest half: rounds to infinity
        return float("inf") if x > 0 else float("-inf")


def round_f16(values):
    """An 'f' array of the values rounded to half precision."""
    n = len(values)
    try:
        return array("f", struct.unpack(f"<{n}e", struct.pack(f"<{n}e", *values)))
    except OverflowError:
        return array("f", map(_f16_one, values))


def _bf16_bits(u):
    """Upper 16 bits (still in place) of f32 bit patterns, rounded to nearest even."""
    return [((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFF0000) if (x & 0x7FFFFFFF) <= 0x7F800000
            else 0x7FC00000 for x in u]  # NaN -> the canonical quiet NaN, as numpy's backend


def _f32_bits(values):
    u = array(_U32)
    u.frombytes(array("f", values).tobytes())
    return u


def round_bf16(values):
    """An 'f' array of the values rounded first to f32 then to bfloat16 (as torch does)."""
    out = array("f")
    out.frombytes(array(_U32, _bf16_bits(_f32_bits(values))).tobytes())
    return out


def pack(values, dtype):
    """Contiguous storage of dtype from an iterable of Python numbers (rounded / wrapped)."""
    if dtype is f16:
        return round_f16(values if isinstance(values, (list, array)) else list(values))
    if dtype is bf16:
        return round_bf16(values)
    if dtype is bool_:
        return array("B", [1 if v else 0 for v in values])
    if dtype.kind == "f":
        return array(dtype.code, values)
    if not isinstance(values, (list, array)):
        values = list(values)
    try:
        return array(dtype.code, values)
    except OverflowError:
        return array(dtype.code, wrap_ints(values, dtype))
    except TypeError:  # floats for an integer dtype: truncate toward zero
        return pack(to_ints(values, dtype), dtype)


def to_ints(values, dtype):
    """Floats truncated toward zero; NaN and infinities become the dtype's lowest value
    (what numpy's float->int conversion gives on x86)."""
    lo = int_range(dtype)[0]
    try:
        return list(map(int, values))
    except (ValueError, OverflowError):
        return [int(v) if v - v == 0 else lo for v in values]


def empty(dtype):
    return array(dtype.code)


# ---- reading a layout -------------------------------------------------------------
def offsets(base, dims):
    """Flat offsets (row-major) of an index grid; dims is a list of per-dim step lists."""
    idx = [base]
    for steps in dims:
        idx = [b + s for b in idx for s in steps]
    return idx


def read(storage, layout):
    """The layout's elements in row-major order, as a new array of the storage's typecode."""
    n = layout.numel()
    off = layout.offset
    if n == 0:
        return storage[0:0]
    if layout.is_contiguous():
        return storage[off:off + n]
    shape, (strides,) = coalesce_dims(layout.shape, [layout.strides])
    dims = list(zip(shape, strides))
    size, stride = dims[-1]
    outer = offsets(off, [[k * st for k in range(s)] for s, st in dims[:-1]])
    if size < 8:  # short rows: gather by offset directly
        inner = [k * stride for k in range(size)]
        get = storage.__getitem__
        return array(storage.typecode, [get(b + s) for b in outer for s in inner])
    out = array(storage.typecode)
    if stride == 0:
        for b in outer:
            out.extend(storage[b:b + 1] * size)
    elif stride > 0:
        span = (size - 1) * stride + 1
        for b in outer:
            out.extend(storage[b:b + span:stride])
    else:
        for b in outer:
            stop = b + (size - 1) * stride - 1
            out.extend(storage[b:stop if stop >= 0 else None:stride])
    return out


def read_list(storage, layout):
    """As `read`, but a list (faster to index and iterate repeatedly)."""
    return read(storage, layout).tolist()


# ---- bytes ------------------------------------------------------------------------------
def to_le_bytes(arr):
    if _BIG_ENDIAN and arr.itemsize > 1:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def from_le_bytes(code, data):
    arr = array(code)
    arr.frombytes(data)
    if _BIG_ENDIAN and arr.itemsize > 1:
        arr.byteswap()
    return arr


def f16_from_bytes(data):
    n = len(data) // 2
    return array("f", struct.unpack(f"<{n}e", data))


def f16_to_bytes(values):
    return struct.pack(f"<{len(values)}e", *values)


def bf16_from_bytes(data):
    halves = from_le_bytes("H", data)
    out = array("f")
    out.frombytes(array(_U32, [h << 16 for h in halves]).tobytes())
    return out


def bf16_to_bytes(values):
    # Stored values are exact bf16, so the upper half of the f32 bits is the answer
    # (NaNs are canonicalised by the same rounding helper).
    return to_le_bytes(array("H", [b >> 16 for b in _bf16_bits(_f32_bits(values))]))

