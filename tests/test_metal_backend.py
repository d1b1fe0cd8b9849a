"""The Metal backend. On a Mac with PyObjC, tallow.Device("metal") runs the op suite
(test_ops.py, through the device fixture) on the GPU; elsewhere it is a DeviceError with
the reason, and constructing it is checked to say so.

Without a Mac, the MSL kernels still run here: tallow_metal.cpu_driver compiles them
with g++ against the shim + a fiber runtime (barriers and simd_sum synchronise), and the
whole op suite from test_ops.py is imported below and run on MetalBackend over that
emulator -- the MSL kernels, the argument packing of the real Metal driver, and the host
logic shared with CUDA, all against numpy and torch. It does not prove that Metal's
compiler accepts the sources or how fast they run on a GPU (see msl_cpu_runtime.h).
"""
import shutil
import struct
import sys

import numpy as np
import pytest

import tallow
from tallow import device as device_module
from tallow_cuda.host import F64, I32, I64, U32, U64, IN_KERNEL_QUANTS, Meta
from tallow_metal.driver import MetalDriver, kernel_source, pack_arg

import test_ops
from test_ops import *  # noqa: F401,F403  (the op suite, run below on the emulated Metal backend)


@pytest.fixture(scope="module")
def emulated_metal():
    """Device("metal") backed by the MSL CPU emulator for this module's tests (restored after)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to run the MSL kernels on the CPU")
    if sys.platform == "darwin":
        pytest.skip("on macOS the real Metal device is tested instead")
    saved, saved_default = device_module._BACKENDS["metal"], device_module._default
    device_module._default = tallow.Device("cpu")  # default_device() must not pick the emulator meanwhile
    device_module._instances.pop("metal", None)
    device_module._BACKENDS["metal"] = ("tallow_metal.cpu_driver", "MetalCpuEmulatorBackend", "")
    try:
        yield tallow.Device("metal")
    finally:
        device_module._BACKENDS["metal"] = saved
        device_module._default = saved_default
        device_module._instances.pop("metal", None)


@pytest.fixture
def device(emulated_metal):
    """Overrides conftest's device fixture: the imported op suite runs on the emulated Metal backend."""
    return emulated_metal


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64", "u32", "bool"])
def test_dtype_roundtrip(device, name):
    if name == "f64":  # Metal has no double: refused, never silently narrowed
        with pytest.raises(tallow.UnsupportedError, match="f64"):
            tallow.tensor([1.0, 2.0], dtype=tallow.f64, device=device)
        return
    test_ops.test_dtype_roundtrip(device, name)


def quantised_blocks(qtype, n, k, seed=0):
    """GGUF blocks of an (n, k) weight: quantised by tallow.quant, or for Q6_K (no quantiser
    there) random blocks with a sane f16 scale; references dequantise them with tallow.quant,
    which is checked bit-exact against the gguf package in test_quant.py."""
    from tallow.quant import quantize_numpy
    rng = np.random.default_rng(seed)
    if qtype != "q6_k":
        return quantize_numpy(rng.standard_normal((n, k)).astype(np.float32), qtype)
    blocks = rng.integers(0, 256, (n * k // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    return blocks


# ---- backend checks beyond the op suite ---------------------------------------------------------
@pytest.mark.parametrize("qtype", IN_KERNEL_QUANTS)
@pytest.mark.parametrize("m", [1, 10])  # the in-kernel matvec, and dequantise + the matmul kernel
def test_quantised_matmul_and_rows_match_numpy(device, qtype, m):
    from tallow.quant import dequantize_numpy, qmatmul_numpy
    rng = np.random.default_rng(0)
    n, k = 40, 512
    blocks = quantised_blocks(qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = tallow.from_buffer(bytes(blocks), qtype, (n, k), device=device)
    got = (tallow.from_numpy(x, device=device) @ w.T).numpy()
    np.testing.assert_allclose(got, qmatmul_numpy(x, blocks, tallow.get_dtype(qtype), n, k), rtol=1e-4, atol=2e-3)
    rows = w.index_select(0, tallow.tensor([39, 0, 7], device=device)).numpy()
    np.testing.assert_array_equal(rows, dequantize_numpy(blocks, qtype, n * k).reshape(n, k)[[39, 0, 7]])


def test_quantised_format_without_kernel_is_dequantised_exactly(device):
    from tallow.quant import dequantize_numpy, quantize_numpy
    blocks = quantize_numpy(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32), "q5_0")
    w = tallow.from_buffer(bytes(blocks), "q5_0", (64, 32), device=device)
    np.testing.assert_array_equal(w.to(tallow.f32).numpy().reshape(-1), dequantize_numpy(blocks, "q5_0", 64 * 32))


def test_attention_reads_kv_cache_views_without_copies(device):
    """tk > tq through a narrowed cache, GQA-expanded heads, a broadcast mask, and keys longer than a block."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 3, 16)).astype(np.float32)
    cache = rng.standard_normal((1, 2, 400, 16)).astype(np.float32)
    mask = rng.standard_normal((1, 1, 3, 300)).astype(np.float32)
    def run(dev):
        k = tallow.from_numpy(cache, device=dev).narrow(2, 0, 300)
        v = tallow.from_numpy(cache[:, :, ::-1].copy(), device=dev).narrow(2, 50, 300)
        return tallow.scaled_dot_product_attention(tallow.from_numpy(q, device=dev), k, v, tallow.from_numpy(mask, device=dev),
                                                   is_causal=True).numpy()
    np.testing.assert_allclose(run(device), run("cpu"), rtol=1e-4, atol=1e-5)


def test_long_rows_and_scatter_into_i64_refused(device):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 1000)).astype(np.float32)  # rows longer than a threadgroup
    x = tallow.from_numpy(a, device=device)
    np.testing.assert_allclose(x.softmax(-1).numpy(), tallow.from_numpy(a).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5)
    assert x.argmin(1).tolist() == a.argmin(1).tolist()
    dst = tallow.zeros(2, 3, dtype=tallow.i64, device=device)
    with pytest.raises(tallow.UnsupportedError, match="64-bit atomics"):
        dst.scatter_add(1, tallow.tensor([[0, 1, 1], [2, 2, 2]], device=device), tallow.ones(2, 3, dtype=tallow.i64, device=device))


# ---- without a Mac ---------------------------------------------------------------------------
def test_device_error_says_why():
    if sys.platform == "darwin":
        pytest.skip("this is a Mac")
    with pytest.raises(tallow.DeviceError, match="macOS"):
        MetalDriver()


def test_pack_arg_matches_the_msl_parameter_types():
    """Scalars are bound with setBytes as the kernels declare them: int, long, ulong, float (no double)."""
    assert pack_arg(I32(-2)) == struct.pack("<i", -2)
    assert pack_arg(I64(1 << 40)) == struct.pack("<q", 1 << 40)
    assert pack_arg(U64((1 << 64) - 1)) == b"\xff" * 8
    assert pack_arg(U32(7)) == struct.pack("<I", 7)  # a custom op's `constant uint& numel`
    assert pack_arg(F64(0.1)) == np.float32(0.1).tobytes()
    assert pack_arg(Meta([1, 2, -3])) == np.array([1, 2, -3], np.int32).tobytes()
    with pytest.raises(TypeError):
        pack_arg(0.5)


def test_kernel_source_prepends_common():
    src = kernel_source("reduce")
    assert src.index("inline long strided_offset") < src.index("kernel void reduce_##NAME")


def test_zz_the_suite_ran_on_the_msl_kernels(emulated_metal):
    """Not vacuous: the tests above went through the emulated Metal driver's kernel launches."""
    from tallow_metal.cpu_driver import MetalCpuEmulatorBackend
    backend = emulated_metal.backend
    assert isinstance(backend, MetalCpuEmulatorBackend)
    if backend.driver.launches == 0:
        pytest.skip("run with the whole module: this counts the kernel launches of the tests above")
    assert backend.driver.launches > 300  # 446 when written
