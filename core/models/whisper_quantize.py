"""Whisper with its linear weights quantised at load (`whisper.load(..., quantize="q8_0")`).

A float checkpoint's matrices are quantised into GGUF blocks as they are read, so the
model holds no f32 copy of them: every projection of the encoder and decoder (q/k/v/out,
fc1, fc2) and the token embedding, which is also the output head (the biggest matrix a
decoding step reads). On the CPU with numba, one-row products (decoding steps) run the
integer-dot kernels in tallow.backends.cpu.kernels.int_dot: int8 weights like faster-whisper's
int8 (its activations are 8-bit, these 16-bit); many rows (the encoder, the audio's
cross-attention keys and values) dequantise a tile at a time into BLAS.

Convolutions, positions, layer norms and biases stay float: they are small, and the
positions are read as row ranges, which block tensors do not offer.
"""
from ..errors import Error

CHOICES = ("q8_0",)  # 8-bit blocks of 32, one f16 scale each: the int8 of faster-whisper's compute_type="int8"


def check_choice(quantize):
    """quantize itself when it names a supported format (or is None), else a clear Error."""
    if quantize is not None and quantize not in CHOICES:
        raise Error(f"whisper: cannot quantise the weights to {quantize!r}; choices: {', '.join(CHOICES)} "
                    "(leave it out for float weights)")
    return quantize


def is_quantized_weight(name, shape, block_size):
    """Whether checkpoint tensor `name` of `shape` is one that load quantises: a linear layer's
    or the token embedding's matrix whose rows are whole blocks."""
    linear = name.endswith("_proj.weight") or name.endswith(("fc1.weight", "fc2.weight"))
    embedding = name.endswith("decoder.embed_tokens.weight")
    return (linear or embedding) and len(shape) == 2 and shape[-1] % block_size == 0


class QuantizedWeights:
    """A weights source (VarBuilder's: a {name: Tensor} dict or a tallow.io reader) whose
    linear matrices come out quantised to `qtype`, the rest as stored."""

    def __init__(self, source, qtype):
        from ..quant import quant_dtype
        self.source, self.qtype = source, quant_dtype(qtype)

    def keys(self):
        return self.source.keys()

    def tensor(self, name, device=None):
        from .. import dtypes as D
        src = self.source
        t = src[name] if isinstance(src, dict) else src.tensor(name, device=device)
        if not t.dtype.is_float or not is_quantized_weight(name, t.shape, self.qtype.block_size):
            return t
        return t.to(D.f32).to(self.qtype)  # numpy's GGUF encoder (tallow.quant), blocks on t's device
