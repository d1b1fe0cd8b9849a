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


def assert_quantised_product_close(got, x, w, tol=1e-5, qtype=None):
    """got ~ x @ w.T for GGUF weights w (dequantised; qtype their block type), allowing what a
    backend's activation quantisation may move it by: the CPU's numba kernels quantise x per 32
    values to 16 bits, as ggml does to 8, so each value moves by at most half a step
    (amax/32767/2); for the K-quants they then take 8 of those bits (quantised_activation_error)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    want = x @ w.T
    np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want),
                                 quantised_activation_error(x, w, qtype) + tol * (1 + np.abs(want)))


K_QUANTS = ("q4_k", "q5_k", "q6_k")


def quantised_activation_error(x, w, qtype=None):
    """The most x @ w.T can move when x is quantised per 32 values to 16 bits (see above), and for
    K-quant weights (qtype: a name or dtype) requantised to 8 bits as the CPU's byte-dot kernels
    do (cpu kquant_ir: a further half step of amax * 32768 / 32767 / 127). A prompt (more than
    PROMPT_ROWS rows of x) may instead be quantised to 8 bits once, as ggml does, per 32 values,
    or per 256 for the K-quants (cpu int_tiles): a half step of that block's amax / 127."""
    k = x.shape[-1]
    amax = np.abs(x.reshape(*x.shape[:-1], k // 32, 32)).max(axis=-1)
    step = amax / 32767
    kquant = str(getattr(qtype, "name", qtype)).lower() in K_QUANTS
    if kquant:
        step = step + amax * (32768 / 32767) / 127
    if x.reshape(-1, k).shape[0] > PROMPT_ROWS:
        group = 256 if kquant and k % 256 == 0 else 32
        wide = np.abs(x.reshape(*x.shape[:-1], k // group, group)).max(axis=-1)
        step = np.maximum(step, np.repeat(wide, group // 32, axis=-1) / 127)
    return (step / 2) @ np.abs(w.reshape(w.shape[0], k // 32, 32)).sum(axis=-1).T


PROMPT_ROWS = 8  # (the CPU's kernel_calls.FUSED_MAX_ROWS: more rows take its 8-bit prompt tiles)
