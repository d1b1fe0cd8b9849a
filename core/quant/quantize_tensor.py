"""Quantising float values into GGUF blocks (needs numpy); Tensor.to(<block dtype>) uses it."""
from ..errors import UnsupportedError
from .formats import quant_dtype
from .quantize_numpy import quantize_numpy


def quantize_bytes(t, dtype):
    """The GGUF blocks of a float tensor (last dim a multiple of the block size) as bytes."""
    d = quant_dtype(dtype)
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise UnsupportedError(f"quantising to {d.name} needs numpy, which is not available here") from None
    return quantize_numpy(t.numpy(), d).tobytes()


def quantize(t, dtype):
    """A tensor of block dtype `dtype` (same shape and device) holding `t` quantised."""
    return t.to(quant_dtype(dtype))
