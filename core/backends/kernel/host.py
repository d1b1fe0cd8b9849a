"""Host-side logic for backends that launch C-like kernels (tallow_cuda and tallow_metal,
through KernelBackend): op codes, dtype names, argument packing of shapes and strides,
launch grids and value packing. Pure Python: no cupy, no numpy, so it is
tested on machines without a GPU.

The kernels find strided operands through a `meta` int32 array:
    [ndim, shape[MAX_DIMS], then per operand: offset, strides[MAX_DIMS]]
(see core/backends/gpu_kernels/common.h: strided_offset).
"""
import struct

from tallow.dtypes import bf16, bool_, f16, f32, f64, i8, i32, i64, u8, u32
from tallow.errors import UnsupportedError
from tallow.layout import kernel_meta, numel_of

from ..gpu_plan import IN_KERNEL_QUANTS, MAX_DIMS, f32_bits

BLOCK = 256  # threads per block for 1-D and row kernels (kernels assume it for row kernels)
MAX_BLOCKS = 1 << 20  # 1-D kernels loop over the grid, so a capped grid covers any size

# The order of each table is the kernels' enum order (core/backends/gpu_kernels/common.h).
UNARY_CODES = {name: i for i, name in enumerate((
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
    "gelu_tanh", "silu", "square", "reciprocal", "floor", "ceil", "round", "sign", "clamp",
    "pow_scalar", "affine", "expm1"))}
BINARY_CODES = {name: i for i, name in enumerate(("add", "sub", "mul", "div", "pow", "maximum", "minimum"))}
COMPARE_CODES = {name: i for i, name in enumerate(("eq", "ne", "lt", "le", "gt", "ge"))}
REDUCE_CODES = {"sum": 0, "prod": 1, "max": 2, "min": 3}

ALL_DTYPES = (f32, f16, bf16, f64, i64, i32, i8, u32, u8, bool_)
GATED_MATVEC_DTYPES = (f32, f16, bf16)  # the float (gated) matvecs accumulate in f32 (warp sums are f32)
FLOAT_DTYPES = (f32, f16, bf16, f64)

# Storage C type per dtype: what a kernel's pointer points to (f16/bf16 hold the 16-bit pattern).
C_STORAGE_TYPES = {
    "f32": "float", "f16": "unsigned short", "bf16": "unsigned short", "f64": "double",
    "i64": "long long", "i32": "int", "i8": "signed char", "u32": "unsigned int",
    "u8": "unsigned char", "bool": "unsigned char",
}
# Scatter-add accumulates in a dtype the GPU can add atomically; the result is cast back.
SCATTER_WORK_DTYPES = {"f32": f32, "f16": f32, "bf16": f32, "f64": f64, "i64": i64, "i32": i32,
                       "i8": i32, "u8": i32, "bool": i32, "u32": u32}
WIDTH_KERNEL_SUFFIX = {1: "w1", 2: "w2", 4: "w4", 8: "w8"}


# ---- kernel arguments ---------------------------------------------------------------
class I32(int):
    """A 32-bit signed kernel argument (C `int`)."""


class I64(int):
    """A 64-bit signed kernel argument (C `long long`; Metal `long`)."""


class U32(int):
    """A 32-bit unsigned kernel argument (C `unsigned int`; Metal `uint`): a custom op's numel."""


class U64(int):
    """A 64-bit unsigned kernel argument (fill values as raw bits)."""


class F64(float):
    """A floating kernel argument: C `double` in CUDA, `float` in Metal (which has no double)."""


class Meta(tuple):
    """A small read-only int32 array argument (shapes, strides): uploaded and cached by the driver."""


def kernel_name(family, dtype):
    """`unary` + f16 -> 'unary_f16'; one kernel per (family, dtype)."""
    return f"{family}_{dtype.name}"


def width_kernel(family, dtype):
    """Kernels that only move elements are chosen by element width: copy_w4 serves f32, i32, u32."""
    return f"{family}_{WIDTH_KERNEL_SUFFIX[dtype.itemsize]}"


# ---- shapes and strides ---------------------------------------------------------------
def pack_meta(shape, operands, what="op"):
    """The meta array for an element-wise launch over `shape` (row-major), where operands
    are (offset, strides) pairs or Layouts (tallow.layout.kernel_meta: dims merged first;
    UnsupportedError beyond MAX_DIMS dims or int32 offsets)."""
    return Meta(kernel_meta(shape, operands, MAX_DIMS, what))


def meta_offset(meta, operand, i):
    """What the kernels compute for element i of `operand` (a reference for tests)."""
    nd = meta[0]
    shape = meta[1:1 + nd]
    base = 1 + MAX_DIMS + operand * (MAX_DIMS + 1)
    off = meta[base]
    for d in range(nd - 1, -1, -1):
        off += (i % shape[d]) * meta[base + 1 + d]
        i //= shape[d]
    return off


def rows_of(shape, n_last):
    """(rows, row length) when the last n_last dims of shape form each row."""
    if n_last == 0:
        return numel_of(shape), 1
    return numel_of(shape[:-n_last]), numel_of(shape[-n_last:])


# ---- launch grids -----------------------------------------------------------------------
def grid_1d(n, block=BLOCK, max_blocks=MAX_BLOCKS):
    """Blocks for n threads' worth of work (the kernels loop when the grid is capped)."""
    if n <= 0:
        return 0
    return min((n + block - 1) // block, max_blocks)


def grid_rows(rows, block=BLOCK):
    """Row kernels: one block of `block` threads per row."""
    return (rows, 1, 1), (block, 1, 1)


def grid_qmatvec(n, m, warps_per_block=4, warp=32):
    """Quantised matvec: one warp per output column, grid.y over the rows of x."""
    return ((n + warps_per_block - 1) // warps_per_block, m, 1), (warps_per_block * warp, 1, 1)


# ---- values ---------------------------------------------------------------------------
def bf16_bits(value):
    """Round-to-nearest-even bf16 bits of a Python float (as the kernels and the numpy backend)."""
    value = float(value)
    if value != value:
        return 0x7FC0
    try:
        u = f32_bits(value)
    except OverflowError:  # beyond f32: infinity
        return 0x7F80 if value > 0 else 0xFF80
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def f16_bits(value):
    value = float(value)
    try:
        return struct.unpack("<H", struct.pack("<e", value))[0]
    except OverflowError:  # beyond f16's range: infinity, as a float conversion gives
        return 0x7C00 if value > 0 else 0xFC00


_INT_FORMATS = {"i64": "q", "i32": "i", "i8": "b", "u32": "I", "u8": "B"}


def scalar_bits(value, dtype):
    """The raw bits of one value of dtype, as an unsigned integer (for fill kernels)."""
    if dtype is bf16:
        return bf16_bits(value)
    if dtype is f16:
        return f16_bits(value)
    if dtype is f32:
        try:
            return f32_bits(float(value))
        except OverflowError:
            return 0x7F800000 if value > 0 else 0xFF800000
    if dtype is f64:
        return struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    if dtype is bool_:
        return 1 if value else 0
    bits = int(value) & ((1 << (8 * dtype.itemsize)) - 1)  # two's complement, wrapping as a C cast
    return bits


def staging_dtype(dtype):
    """The dtype host lists are packed in before a device cast to `dtype`: f64 for floats
    (f32 where the device has no f64), i64 for integers, bool for bool."""
    if dtype.is_float:
        return f64
    return bool_ if dtype is bool_ else i64


def pack_values(values, dtype):
    """Little-endian bytes of a flat list in f32/f64/i64/bool (see staging_dtype)."""
    n = len(values)
    if dtype is f64:
        return struct.pack(f"<{n}d", *[float(v) for v in values])
    if dtype is f32:
        return struct.pack(f"<{n}f", *[_f32_safe(float(v)) for v in values])
    if dtype is bool_:
        return bytes(1 if v else 0 for v in values)
    if dtype is i64:
        return struct.pack(f"<{n}q", *[int(v) for v in values])
    raise UnsupportedError(f"pack_values: {dtype.name} is not a staging dtype")


def _f32_safe(v):
    if v != v or abs(v) <= 3.4028234663852886e38:
        return v
    return float("inf") if v > 0 else float("-inf")


def unpack_values(raw, dtype):
    """A flat list of Python numbers from little-endian bytes of dtype."""
    n = len(raw) // dtype.itemsize
    if dtype is bf16:
        bits = struct.unpack(f"<{n}H", raw)
        return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}I", *[b << 16 for b in bits])))
    if dtype is f16:
        return list(struct.unpack(f"<{n}e", raw))
    if dtype is f32:
        return list(struct.unpack(f"<{n}f", raw))
    if dtype is f64:
        return list(struct.unpack(f"<{n}d", raw))
    if dtype is bool_:
        return [b != 0 for b in raw]
    return list(struct.unpack(f"<{n}{_INT_FORMATS[dtype.name]}", raw))


# ---- the kernels the host launches ------------------------------------------------------
def kernel_inventory(has_f64=True, atomic64=True, matmul_dtypes=()):
    """{module: sorted kernel names} that KernelBackend may launch on a driver with these
    capabilities (CUDA: f64 and 64-bit atomics; Metal: neither, plus its own matmul kernels).
    The kernel-source tests check every name is compiled."""
    dts = [d for d in ALL_DTYPES if has_f64 or d is not f64]
    floats = [d for d in FLOAT_DTYPES if has_f64 or d is not f64]
    widths = sorted({d.itemsize for d in dts})
    ew = [f"{fam}_{d.name}" for fam in ("unary", "binary", "compare", "where") for d in dts]
    ew += [f"cast_{s.name}_{d.name}" for s in dts for d in dts if s is not d]
    ew += [f"{fam}_{WIDTH_KERNEL_SUFFIX[w]}" for fam in ("copy", "assign", "fill") for w in widths]
    red = [f"{fam}_{d.name}" for fam in ("reduce", "cumsum", "argreduce") for d in dts]
    red += [f"{fam}_{d.name}" for fam in ("softmax", "layer_norm", "rms_norm", "add_norm") for d in floats]
    work = {d for d in SCATTER_WORK_DTYPES.values() if (has_f64 or d is not f64) and (atomic64 or d.itemsize < 8)}
    idx = [f"{fam}_{WIDTH_KERNEL_SUFFIX[w]}" for fam in ("index_select", "gather") for w in widths]
    idx += [f"scatter_add_{d.name}" for d in work]
    idx += [f"{fam}_{d.name}" for fam in ("rope", "im2col", "rope_kv_write", "kv_write") for d in floats]
    inv = {
        "elementwise": ew, "reduce": red, "index": idx,
        "attention": [f"{fam}_{d.name}" for fam in ("attention", "attention_step", "attention_rows",
                                                    "attention_rows_step") for d in floats],
        "quant": [f"{fam}_{q}" for fam in ("qmatvec", "dequant", "gated_qmatvec") for q in IN_KERNEL_QUANTS]
        + [f"{fam}_{d.name}" for fam in ("gated_matvec", "matvec") for d in GATED_MATVEC_DTYPES],
    }
    if matmul_dtypes:
        inv["matmul"] = [f"matmul_{d.name}" for d in matmul_dtypes]
    return {k: sorted(v) for k, v in inv.items()}
