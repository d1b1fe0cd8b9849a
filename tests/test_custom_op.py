"""A user-defined op (softplus) with CPU, pure-Python, WGSL, CUDA and MSL implementations and a
backward, on every device. Without an NVIDIA GPU or a Mac, "cuda" and "metal" are the CPU emulators
(tallow_cuda.cpu_driver, tallow_metal.cpu_driver), which compile and run the op's own cuda/msl source."""
import math
import shutil

import numpy as np
import pytest

import tallow
from tallow import device as device_module

torch = pytest.importorskip("torch")

EMULATORS = {"cuda": ("tallow_cuda.cpu_driver", "CudaCpuEmulatorBackend"),
             "metal": ("tallow_metal.cpu_driver", "MetalCpuEmulatorBackend")}


@pytest.fixture(scope="module", params=["cpu", "python", "wgpu", "cuda", "metal"])
def device(request):
    """Every device; cuda and metal fall back to their kernels on the CPU emulator."""
    name = request.param
    try:
        yield tallow.Device(name)
        return
    except tallow.DeviceError as e:
        if name not in EMULATORS:
            pytest.skip(f"device {name} is not available here: {e}")
        if shutil.which("g++") is None:
            pytest.skip(f"no {name} device ({e}) and no g++ for its CPU emulator")
    import importlib
    module, cls = EMULATORS[name]
    saved_default = device_module._default
    device_module._default = tallow.Device("cpu")  # default_device() must not pick the emulator meanwhile
    try:
        yield device_module.use_backend(name, getattr(importlib.import_module(module), cls)())
    finally:
        device_module._instances.pop(name, None)
        device_module._default = saved_default


class Softplus(tallow.CustomOp):
    name = "softplus"
    wgsl = """
struct Params { numel: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> in0: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= params.numel) { return; }
    let x = in0[i];
    out[i] = max(x, 0.0) + log(1.0 + exp(-abs(x)));
}
"""
    cuda = """
extern "C" __global__ void main_kernel(const float* in0, float* out, unsigned int numel) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) { float x = in0[i]; out[i] = fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))); }
}
"""

    msl = """
#include <metal_stdlib>
using namespace metal;
kernel void main_kernel(device const float* in0 [[buffer(0)]], device float* out [[buffer(1)]],
                        constant uint& numel [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= numel) { return; }
    float x = in0[i];
    out[i] = max(x, 0.0f) + log(1.0f + exp(-abs(x)));
}
"""

    def cpu(self, x):
        return np.logaddexp(0, x)

    def python(self, x):
        values, _shape = x
        return [max(v, 0.0) + math.log1p(math.exp(-abs(v))) for v in values]

    def backward(self, inputs, output, grad):
        return (grad * inputs[0].sigmoid(),)


def test_custom_op_forward_and_backward(device):
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 4
    x = tallow.from_numpy(a, device).requires_grad_()
    y = tallow.custom_op(Softplus(), x.T)  # a non-contiguous input
    ref = torch.from_numpy(a).requires_grad_()
    r = torch.nn.functional.softplus(ref.T)
    np.testing.assert_allclose(y.numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-6)
    (y * y).sum().backward()
    (r * r).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_custom_op_missing_implementation_is_clear(device):
    class CpuOnly(tallow.CustomOp):
        name = "cpu_only"

        def cpu(self, x):
            return x * 2

    x = tallow.ones(3, device=device)
    if device.type == "cpu":
        assert tallow.custom_op(CpuOnly(), x).tolist() == [2.0, 2.0, 2.0]
    else:
        with pytest.raises(tallow.UnsupportedError, match="cpu_only"):
            tallow.custom_op(CpuOnly(), x)


def test_custom_op_shape_mismatch_is_reported():
    class Wrong(tallow.CustomOp):
        name = "wrong"

        def cpu(self, x):
            return x[:1]

    with pytest.raises(tallow.ShapeError, match="wrong"):
        tallow.custom_op(Wrong(), tallow.ones(3, device="cpu"))


class ScaleAdd(tallow.CustomOp):
    """Two inputs, the second broadcast (so copied contiguous first): out = 3 * a + b."""
    name = "scale_add"
    wgsl = """
struct Params { numel: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> in0: array<f32>;
@group(0) @binding(2) var<storage, read> in1: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < params.numel) { out[gid.x] = 3.0 * in0[gid.x] + in1[gid.x]; }
}
"""
    cuda = """
extern "C" __global__ void main_kernel(const float* in0, const float* in1, float* out, unsigned int numel) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) { out[i] = 3.0f * in0[i] + in1[i]; }
}
"""
    msl = """
#include <metal_stdlib>
using namespace metal;
kernel void main_kernel(device const float* in0 [[buffer(0)]], device const float* in1 [[buffer(1)]],
                        device float* out [[buffer(2)]], constant uint& numel [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
    if (i < numel) { out[i] = 3.0f * in0[i] + in1[i]; }
}
"""

    def cpu(self, a, b):
        return 3 * a + b

    def python(self, a, b):
        return [3 * x + y for x, y in zip(a[0], b[0])]


def test_custom_op_with_two_inputs_one_broadcast(device):
    """300 elements: more than one block of threads, so the launch grid must cover them all."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 100)).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    got = tallow.custom_op(ScaleAdd(), tallow.from_numpy(a, device), tallow.from_numpy(b, device).broadcast_to((3, 100)))
    np.testing.assert_allclose(got.numpy(), 3 * a + b, rtol=1e-6, atol=1e-6)


def test_custom_kernels_refuse_other_dtypes_clearly(device):
    if device.type in ("cpu", "python"):
        pytest.skip("cpu() and python() take any dtype")
    with pytest.raises(tallow.UnsupportedError, match="f32"):
        tallow.custom_op(Softplus(), tallow.ones(3, dtype=tallow.i32, device=device))
