"""GGML tensor types: their GGUF type ids, block geometry, and the tallow dtypes
for the GGUF block formats tallow can compute with.

A block format stores `block_size` consecutive elements of a row in
`block_bytes` bytes (scales + packed integers). The layouts follow ggml's
`block_q4_0`, ..., `block_q8_K` structs (all little-endian).
"""
from ..dtypes import QUANTIZED, get_dtype
from ..errors import DTypeError

QK_K = 256  # elements per super-block of the k-quants

# ggml type id -> (GGUF name, elements per block, bytes per block), for every
# type a GGUF file may name, so that readers can size and bounds-check tensors
# even of types tallow cannot decode.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}

# The block formats tallow decodes: the block dtypes tallow.dtypes declares.
QUANT_NAMES = tuple(d.name for d in QUANTIZED)

_GGML_ID_BY_NAME = {name.lower(): tid for tid, (name, _, _) in GGML_TYPES.items()}

# ggml type id <-> tallow dtype name, for every type tallow can hold.
GGML_TO_DTYPE = {0: "f32", 1: "f16", 24: "i8", 26: "i32", 27: "i64", 28: "f64", 30: "bf16"}
GGML_TO_DTYPE.update({_GGML_ID_BY_NAME[q]: q for q in QUANT_NAMES})
DTYPE_TO_GGML = {v: k for k, v in GGML_TO_DTYPE.items()}


def quant_dtype(qtype):
    """The registered block DType for a name ('q4_0'), a DType, or a ggml type id."""
    if isinstance(qtype, int):
        name = GGML_TO_DTYPE.get(qtype)
        if name is None or name not in QUANT_NAMES:
            raise DTypeError(f"ggml type {qtype} ({ggml_type_name(qtype)}) is not a block format tallow supports; "
                             f"supported: {', '.join(QUANT_NAMES)}")
        return get_dtype(name)
    d = get_dtype(qtype)
    if not d.is_quantized:
        raise DTypeError(f"{d.name} is not a quantised block dtype; supported: {', '.join(QUANT_NAMES)}")
    return d


def ggml_type_name(type_id):
    entry = GGML_TYPES.get(type_id)
    return entry[0] if entry else f"unknown type {type_id}"


def ggml_type_of(dtype):
    """The ggml type id of a tallow dtype (or name); None when GGUF has none (u8, u32, bool)."""
    return DTYPE_TO_GGML.get(get_dtype(dtype).name)
