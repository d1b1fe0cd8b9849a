"""Tensor.to(<block dtype>): quantise a float tensor into GGUF blocks (needs numpy)."""
from ..errors import ShapeError, UnsupportedError
from .formats import quant_dtype
from .quantize_numpy import quantize_numpy


def quantize(t, dtype):
    """A tensor of block dtype `dtype` (same shape and device) holding `t` quantised."""
    d = quant_dtype(dtype)
    if not t.shape or t.shape[-1] % d.block_size:
        raise ShapeError(f"quantize to {d.name}: the last dim must be a multiple of {d.block_size}, got shape {tuple(t.shape)}")
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise UnsupportedError(f"quantising to {d.name} needs numpy, which is not available here") from None
    from ..creation import from_buffer
    from ..dtypes import f32
    values = t.to(f32).numpy()
    return from_buffer(quantize_numpy(values, d).tobytes(), d, t.shape, device=t.device)
