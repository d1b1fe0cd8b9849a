"""Data types and promotion.

Promotion (binary ops between tensors): bool < integers < floats.
* float with float -> the wider one; f16 with bf16 -> f32.
* int with int -> the smallest type that holds both (i8+u8 -> i32, i32+u32 -> i64).
* int with float -> the float.
* Python scalars are "weak": they never widen a tensor's dtype, except that a
  float scalar with an integer/bool tensor gives f32 and an int scalar with a
  bool tensor gives i64 (as in PyTorch).
Quantised block dtypes (q4_0, ... : GGUF's block formats) are declared here too,
so every dtype is known without importing tallow.quant; they only take part in
matmul / index_select / dequantisation.
"""
from .errors import DTypeError, ValueRangeError


class DType:
    __slots__ = ("name", "itemsize", "kind", "np_name", "code", "rank", "block_size", "block_bytes")

    def __init__(self, name, itemsize, kind, np_name, code, rank, block_size=1, block_bytes=None):
        self.name = name
        self.itemsize = itemsize  # bytes per element (0 for block formats)
        self.kind = kind  # 'f' float, 'i' signed, 'u' unsigned, 'b' bool, 'q' quantised blocks
        self.np_name = np_name  # numpy storage dtype (bf16 is stored as its uint16 bits)
        self.code = code  # array.array typecode used by the pure-Python backend
        self.rank = rank  # position within its kind, for promotion
        self.block_size = block_size
        self.block_bytes = block_bytes if block_bytes is not None else itemsize

    is_float = property(lambda self: self.kind == "f")
    is_int = property(lambda self: self.kind in "iu")
    is_quantized = property(lambda self: self.kind == "q")

    def nbytes(self, numel):
        if numel % self.block_size:
            raise DTypeError(f"{self.name}: {numel} elements is not a whole number of {self.block_size}-element blocks")
        return numel // self.block_size * self.block_bytes

    def __repr__(self):
        return f"tallow.{self.name}"

    def __reduce__(self):
        return (get_dtype, (self.name,))


f64 = DType("f64", 8, "f", "float64", "d", 4)
f32 = DType("f32", 4, "f", "float32", "f", 3)
f16 = DType("f16", 2, "f", "float16", "f", 1)
bf16 = DType("bf16", 2, "f", "uint16", "f", 2)
i64 = DType("i64", 8, "i", "int64", "q", 4)
i32 = DType("i32", 4, "i", "int32", "i", 3)
i8 = DType("i8", 1, "i", "int8", "b", 1)
u32 = DType("u32", 4, "u", "uint32", "I", 3)
u8 = DType("u8", 1, "u", "uint8", "B", 1)
bool_ = DType("bool", 1, "b", "bool", "B", 0)


# GGUF block formats: (name = lower-case GGUF name, elements per block, bytes per block),
# after ggml's block_q4_0 ... block_q8_K structs (tallow.quant.formats maps them to ggml ids).
_BLOCK_FORMATS = (("q4_0", 32, 18), ("q4_1", 32, 20), ("q5_0", 32, 22), ("q5_1", 32, 24), ("q8_0", 32, 34),
                  ("q2_k", 256, 84), ("q3_k", 256, 110), ("q4_k", 256, 144), ("q5_k", 256, 176),
                  ("q6_k", 256, 210), ("q8_k", 256, 292))
QUANTIZED = tuple(DType(name, 0, "q", None, None, 0, block_size=size, block_bytes=nbytes)
                  for name, size, nbytes in _BLOCK_FORMATS)

_REGISTRY = {d.name: d for d in (f64, f32, f16, bf16, i64, i32, i8, u32, u8, bool_) + QUANTIZED}
_ALIASES = {
    "float32": f32, "float": f32, "float16": f16, "half": f16, "bfloat16": bf16, "float64": f64,
    "double": f64, "int64": i64, "long": i64, "int32": i32, "int": i32, "int8": i8, "uint8": u8,
    "uint32": u32, "bool_": bool_, "F32": f32, "F16": f16, "BF16": bf16, "F64": f64, "I64": i64,
    "I32": i32, "I8": i8, "U8": u8, "U32": u32, "BOOL": bool_,
}


def get_dtype(d):
    """A DType from a DType, a name ('f32', 'float16', 'q4_0'), a numpy dtype or a Python type."""
    if d is None or isinstance(d, DType):
        return d
    if d is float:
        return f32
    if d is int:
        return i64
    if d is bool:
        return bool_
    name = getattr(d, "name", None) if not isinstance(d, str) else d
    if name is None:
        name = str(d)
    found = _REGISTRY.get(name) or _ALIASES.get(name) or _REGISTRY.get(name.lower())
    if found is None:
        raise DTypeError(f"unknown dtype {d!r}; known: {', '.join(sorted(_REGISTRY))}")
    return found


def _int_join(a, b):
    if a.kind == b.kind:
        return a if a.rank >= b.rank else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if s.rank > u.rank:
        return s
    return i32 if u is u8 else i64  # u8 with i8 -> i32; u32 with i32/i8 -> i64


def promote(a, b):
    """Result dtype of a binary op between tensors of dtypes a and b."""
    if a is b:
        return a
    if a.is_quantized or b.is_quantized:
        raise DTypeError(f"quantised dtype {a if a.is_quantized else b} takes part only in matmul; "
                         f"dequantise first with .to(tallow.f32)")
    if a.is_float and b.is_float:
        if {a, b} == {f16, bf16}:
            return f32
        return a if a.rank >= b.rank else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a is bool_:
        return b
    if b is bool_:
        return a
    return _int_join(a, b)


def promote_scalar(t, value):
    """Result dtype of a tensor of dtype t with a Python scalar."""
    if isinstance(value, bool):
        return t
    if isinstance(value, float) and not t.is_float:
        return f32
    if isinstance(value, int) and t is bool_:
        return i64
    return t


def int_bounds(dtype):
    """(smallest, largest) value an integer dtype holds."""
    bits = 8 * dtype.itemsize
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.kind == "i" else (0, (1 << bits) - 1)


def check_ints_fit(values, dtype, op):
    """Raise ValueRangeError unless every value (Python ints, or floats to truncate) fits the
    integer dtype, instead of numpy's OverflowError or the array module's wrap-around."""
    lo, hi = int_bounds(dtype)
    for v in values:
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueRangeError(f"{op}: {v} cannot be stored as {dtype.name} (not a finite number)")
            v = int(v)  # stored truncated, so -0.5 is a valid u8 (0)
        if not lo <= v <= hi:
            raise ValueRangeError(f"{op}: {v} is out of range for {dtype.name} (which holds {lo} to {hi})")


def default_for(value):
    """dtype of a tensor made from a Python scalar or nested list (like torch: f32, i64, bool)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return i64
    return f32
