"""The wasm module's call lists: a captured step as one block of i32 words in the module's memory,
run by its `run(program, count)` export in one call (issue 31 item 3: a decode step costs the
host one call, natively through wasmtime and in the page through JS alike).

A call is its opcode (the kernel's index in OPS) followed by that kernel's arguments, one word
each: addresses and counts as they are, float arguments (eps, scale) as their float32 bits.
A word that is not an opcode where one is expected stops the module with a trap (`unreachable`);
encode() refuses such lists before they get there. Standard library only: the loader and the
page's driver use it, never LLVM.
"""
import struct
from array import array

from ...errors import UnsupportedError

# (kernel, its argument kinds: "i" an i32 address or count, "f" a float32), in opcode order.
OPS = (
    ("quantize_row", "iiiii"),
    ("matmul_q4_0", "iiiiiiiii"), ("matmul_q4_1", "iiiiiiiii"), ("matmul_q5_0", "iiiiiiiii"),
    ("matmul_q5_1", "iiiiiiiii"), ("matmul_q8_0", "iiiiiiiii"), ("matmul_q4_k", "iiiiiiiii"),
    ("matmul_q5_k", "iiiiiiiii"), ("matmul_q6_k", "iiiiiiiii"),
    ("dequant_q4_0", "iiii"), ("dequant_q4_1", "iiii"), ("dequant_q5_0", "iiii"), ("dequant_q5_1", "iiii"),
    ("dequant_q8_0", "iiii"), ("dequant_q4_k", "iiii"), ("dequant_q5_k", "iiii"), ("dequant_q6_k", "iiii"),
    ("f32_matvec", "iiiii"),
    ("add_rms_norm", "iiiifii"),
    ("softmax", "ii"),
    ("silu", "iii"), ("gelu", "iii"),
    ("rope", "iiiiii"),
    ("copy_f32", "iii"),
    ("cache_attention", "iiiiiiiifii"),
    ("silu_mul", "iiii"), ("add_f32", "iiii"),
)
OPCODES = {name: code for code, (name, _) in enumerate(OPS)}


def encode(calls):
    """[(kernel name, args), ...] -> (the program's i32 words, its call count). Names a kernel
    that is not in OPS, or a call with the wrong number of arguments, in the error."""
    words = array("i")
    for name, args in calls:
        code = OPCODES.get(name)
        if code is None:
            raise UnsupportedError(f"wasm program: no kernel {name!r} (known: {', '.join(OPCODES)})")
        kinds = OPS[code][1]
        if len(args) != len(kinds):
            raise UnsupportedError(f"wasm program: {name} takes {len(kinds)} arguments, got {len(args)}")
        words.append(code)
        for kind, value in zip(kinds, args):
            if kind == "f":
                words.append(struct.unpack("<i", struct.pack("<f", value))[0])
            else:
                words.append(struct.unpack("<i", struct.pack("<I", int(value) & 0xFFFFFFFF))[0])
    return words, len(calls)
