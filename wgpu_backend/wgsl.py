"""Builds WGSL sources: kernel files from kernels/ plus per-dtype declarations.

Every tensor dtype has a *storage* type on the GPU (what its buffer holds) and
a *compute* type (what kernels do arithmetic in):

    f32           f32 / f32
    f16           f16 / f32 with shader-f16; else f32 rounded to f16 / f32
    bf16          f32 rounded to bf16 / f32
    i32 i64 i8    i32 / i32   (i64 must fit in i32; i8 wraps to 8 bits)
    u32 u8 bool   u32 / u32   (u8 wraps to 8 bits; bool is 0/1)

A kernel names its operands' types by a letter: `SX`/`CX` are operand X's
storage/compute types, `lx(v)` loads (storage -> compute) and `sx(v)` stores
(compute -> storage, rounding or wrapping to the dtype). Placeholders like
`{{OP}}` are filled in by the backend.

A kernel file shares text with its variants through `// #include "name.wgsl"` lines (whole
lines, at module scope or inside a function), replaced by that file of kernels/ when the file
is read: every driver, the browser's included, gets the expanded text.
"""
import re
from importlib import resources

from tallow.dtypes import bf16, bool_, f16, f32, i8, i32, i64, u8, u32
from tallow.errors import UnsupportedError

_cache = {}


_INCLUDE = re.compile(r'^[ \t]*// #include "(\w+)\.wgsl"[ \t]*$', re.M)


def kernel_text(name, _within=()):
    """kernels/<name>.wgsl with its includes expanded."""
    text = _cache.get(name)
    if text is None:
        if name in _within:
            raise ValueError(f"kernels/{name}.wgsl includes itself (through {' -> '.join(_within)})")
        raw = resources.files("tallow_wgpu").joinpath("kernels", name + ".wgsl").read_text()
        text = _INCLUDE.sub(lambda m: kernel_text(m.group(1), _within + (name,)).rstrip("\n"), raw)
        _cache[name] = text
    return text


def storage_type(dtype, has_f16):
    if dtype is f32 or dtype is bf16:
        return "f32"
    if dtype is f16:
        return "f16" if has_f16 else "f32"
    if dtype in (i32, i64, i8):
        return "i32"
    if dtype in (u32, u8, bool_):
        return "u32"
    raise UnsupportedError(f"the wgpu backend has no {dtype.name} tensors (WGSL has no {dtype.name}); "
                           "convert to f32 first")


def compute_type(dtype):
    if dtype.is_float:
        return "f32"
    return "i32" if dtype.kind == "i" else "u32"


def elem_size(dtype, has_f16):
    return 2 if storage_type(dtype, has_f16) == "f16" else 4


def _store_expr(dtype, has_f16):
    if dtype is bf16:
        return "round_bf16(v)"
    if dtype is f16:
        return "f16(v)" if has_f16 else "round_f16(v)"
    if dtype is i8:
        return "(v << 24u) >> 24u"
    if dtype is u8:
        return "v & 255u"
    if dtype is bool_:
        return "select(0u, 1u, v != 0u)"
    return "v"


def decl(letter, dtype, has_f16):
    """Aliases and load/store functions for operand `letter` of dtype."""
    lo = letter.lower()
    st = storage_type(dtype, has_f16)
    ct = compute_type(dtype)
    load = "f32(v)" if st != ct else "v"
    return (f"alias S{letter} = {st};\nalias C{letter} = {ct};\n"
            f"fn l{lo}(v: S{letter}) -> C{letter} {{ return {load}; }}\n"
            f"fn s{lo}(v: C{letter}) -> S{letter} {{ return {_store_expr(dtype, has_f16)}; }}\n")


def build(kernel, types, has_f16, subs=None, extra=(), prelude=""):
    """Full WGSL source: header, dtype declarations, common helpers, extra files,
    `prelude` (helper functions the op needs), the kernel."""
    parts = []
    if has_f16 and any(storage_type(d, True) == "f16" for d in types.values()):
        parts.append("enable f16;\n")
    for letter, dtype in types.items():
        parts.append(decl(letter, dtype, has_f16))
    parts.append(kernel_text("common"))
    for name in extra:
        parts.append(_substitute(kernel_text(name), subs))
    if prelude:
        parts.append(prelude)
    parts.append(_substitute(kernel_text(kernel), subs))
    return "\n".join(parts)


def _substitute(text, subs):
    """text with each {{KEY}} of subs replaced (the kernel and its included files alike)."""
    for key, value in (subs or {}).items():
        text = text.replace("{{" + key + "}}", value)
    return text
