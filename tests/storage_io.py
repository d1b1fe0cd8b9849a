"""numpy arrays in and out of a backend's raw storage, for the tests that call the backend
contract directly (tests/conformance/test_primitive_paths.py, test_wgpu_backend.py, test_wgpu_split.py)."""
import numpy as np

from tallow import dtypes as D
from tallow.layout import Layout


def bf16_bits(x):
    """The bf16 bit patterns of x, rounded to nearest even (as torch rounds)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def up(be, arr, dtype):
    """Storage of arr (any shape) in dtype, uploaded as raw bytes."""
    arr = np.asarray(arr)
    if dtype is D.bf16:
        return be.from_bytes(bf16_bits(arr).tobytes(), dtype)
    return be.from_bytes(np.ascontiguousarray(arr, dtype.np_name).tobytes(), dtype)


def down(be, st, shape, dtype=D.f32):
    """numpy array (f32 for f16/bf16) of contiguous storage st."""
    raw = be.to_bytes(st, Layout(shape), dtype)
    if dtype is D.bf16:
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype.np_name).reshape(shape).astype(np.float32 if dtype is D.f16 else dtype.np_name)
