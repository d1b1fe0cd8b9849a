"""The wasm module's call lists: a captured step as one block of i32 words in the module's memory,
run by its `run(program, count, step)` export in one call (issue 31 item 3: a decode step costs
the host one call, natively through wasmtime and in the page through JS alike).

A call is its opcode (the kernel's index in OPS), a mask word, then the kernel's arguments:
addresses and counts as they are, float arguments (eps, scale) as their float32 bits. An
address or count that moves with the step (a KV-cache slot, the rotary row, the key count,
the embedding row) is a StepArg: bit i of the mask marks argument i as one, and it takes
three words, base, stride and slot, read as base + stride * step[slot], where `step` is the
i32 words at run's third argument (STEP_SLOTS: the position and the token). So one recorded
program serves every step: the host writes the step words, then calls run.

A word that is not an opcode where one is expected stops the module with a trap (`unreachable`);
encode() refuses such lists before they get there. Standard library only: the loader and the
page's driver use it, never LLVM.
"""
import struct
from array import array
from typing import NamedTuple

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
    ("rope_seq", "iiiiiii"), ("cache_attention_rows", "iiiiiiiiifii"), ("add_layer_norm", "iiiiifii"),
    ("silu_mul", "iiii"), ("add_f32", "iiii"),
    ("argmax_f32", "iiii"),
    ("gemm_f32", "iiiiiiiiiii"), ("gemm_f16", "iiiiiiiiiii"), ("gemm_q", "iiiiiiiiiiii"),
    ("conv1d_f32", "iiiiiiiiiii"), ("softmax_rows", "iiiifii"), ("layer_norm_rows", "iiiiifi"),
    ("f16_to_f32", "iii"), ("f32_to_f16", "iii"), ("rows_f32", "iiiiii"), ("rows_f16", "iiiiii"),
    ("unary_f32", "iiiiff"), ("binary_f32", "iiiii"), ("reduce_f32", "iiii"),
    ("barrier", "ii"),  # threads_ir: (its three words, the thread count); in programs threads.py splits
)
OPCODES = {name: code for code, (name, _) in enumerate(OPS)}
STEP_SLOTS = ("position", "token")  # the step words a StepArg reads, in this order
PAD_WORDS = 2  # after the last call: run reads a word's two neighbours before it knows the kind

# What a host needs to call the GEMMs and the strided kernels (gemm_ir.py, elementwise_ir.py), kept here
# so that a host running kernels.wasm never imports llvmlite or numba: the strided kernels' meta is
# tallow.layout.kernel_meta(shape, operands, STRIDED_DIMS); their op codes are the GPU kernels'
# (kernel/host.py), for the ops these kernels compute, with "mean" added; the GEMMs' tile and block.
STRIDED_DIMS = 4
UNARY_OPS = {"neg": 0, "abs": 1, "exp": 2, "sqrt": 4, "rsqrt": 5, "tanh": 8, "sigmoid": 9, "relu": 10,
             "gelu": 11, "gelu_tanh": 12, "silu": 13, "square": 14, "reciprocal": 15, "floor": 16, "ceil": 17,
             "round": 18, "sign": 19, "clamp": 20, "affine": 22}
BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 5, "minimum": 6}
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "mean": 4}
GEMM_MR, GEMM_NR, GEMM_MB = 4, 8, 128  # rows of A x weight rows a micro-tile; rows of A a block


def gemm_scratch_floats(k, quantised=False):
    """The scratch gemm_f32/gemm_f16 (or gemm_q: quantised) needs, in floats: the packed panel
    (gemm_q adds its dequantised rows)."""
    return GEMM_NR * k * (2 if quantised else 1)


def conv1d_scratch_floats(c_in, t_out, ksize):
    """The scratch conv1d_f32 needs, in floats: the im2col matrix and gemm_f32's."""
    return t_out * c_in * ksize + gemm_scratch_floats(c_in * ksize)


class StepArg(NamedTuple):
    """An argument that is base + stride * (the step's `slot` word) when the program runs."""
    base: int
    stride: int
    slot: str = "position"


def _word(value):
    return struct.unpack("<i", struct.pack("<I", int(value) & 0xFFFFFFFF))[0]


def encode(calls):
    """[(kernel name, args), ...] -> (the program's i32 words, its call count); an argument may be
    a StepArg. Names a kernel that is not in OPS, or a call with the wrong number of arguments,
    in the error."""
    words = array("i")
    for name, args in calls:
        code = OPCODES.get(name)
        if code is None:
            raise UnsupportedError(f"wasm program: no kernel {name!r} (known: {', '.join(OPCODES)})")
        kinds = OPS[code][1]
        if len(args) != len(kinds):
            raise UnsupportedError(f"wasm program: {name} takes {len(kinds)} arguments, got {len(args)}")
        mask = 0
        tail = array("i")
        for i, (kind, value) in enumerate(zip(kinds, args)):
            if isinstance(value, StepArg):
                if kind == "f" or value.slot not in STEP_SLOTS:
                    raise UnsupportedError(f"wasm program: argument {i} of {name} cannot be {value} "
                                           f"(step arguments are addresses or counts, read from {STEP_SLOTS})")
                mask |= 1 << i
                tail.extend((_word(value.base), _word(value.stride), STEP_SLOTS.index(value.slot)))
            elif kind == "f":
                tail.append(struct.unpack("<i", struct.pack("<f", value))[0])
            else:
                tail.append(_word(value))
        words.append(code)
        words.append(mask)
        words.extend(tail)
    words.extend([0] * PAD_WORDS)
    return words, len(calls)


def step_words(position, token=0):
    """The step words a program's StepArgs read (STEP_SLOTS' order), as bytes to write before run."""
    return array("i", [position, token]).tobytes()
