"""The Metal backend, beyond the conformance suite. On a Mac with PyObjC, the "metal"
device of tests/conftest.py runs the op suite (tests/conformance/) on the GPU; elsewhere
it is a DeviceError with the reason, and constructing it is checked to say so.

Without a Mac, the MSL kernels still run here: tallow_metal.cpu_driver compiles them
with g++ against the shim + a fiber runtime (barriers and simd_sum synchronise), and the
conformance suite runs on MetalBackend over that emulator as the "metal-emulator" device
-- the MSL kernels, the argument packing of the real Metal driver, and the host
logic shared with CUDA, all against numpy and torch. It does not prove that Metal's
compiler accepts the sources or how fast they run on a GPU (see msl_cpu_runtime.h).
"""
import struct
import sys

import numpy as np
import pytest

import tallow
from tallow.backends.kernel.host import F64, I32, I64, U32, U64, Meta
from tallow_metal.driver import MetalDriver, kernel_source, pack_arg

from conftest import emulated


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
    assert src.index("DEVICE llong strided_offset") < src.index("KERNEL(reduce_##NAME")


def test_the_emulated_device_launches_the_msl_kernels():
    """The "metal-emulator" device of the conformance suite really runs the MSL kernels:
    bound through tallow.device.use_backend, an op launches them, and the name is restored after."""
    from tallow_metal.cpu_driver import MetalCpuEmulatorBackend
    backend = emulated("metal-emulator")
    assert isinstance(backend, MetalCpuEmulatorBackend)
    dev = tallow.device.use_backend("metal", backend)
    try:
        assert tallow.Device("metal") is dev and tallow.default_device() != "metal"
        launches = backend.driver.launches
        got = tallow.tensor([[1.0, -2.0], [3.0, 0.5]], device="metal").exp().sum(1)
        assert backend.driver.launches >= launches + 2
        np.testing.assert_allclose(got.numpy(), np.exp([[1.0, -2.0], [3.0, 0.5]]).sum(1), rtol=1e-6)
    finally:
        tallow.device.restore_backend("metal")
    with pytest.raises(tallow.DeviceError, match="macOS"):  # this test runs off macOS only (emulated() skips there)
        tallow.Device("metal")
