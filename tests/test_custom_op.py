"""A user-defined op (softplus) with CPU, pure-Python and WGSL implementations and a backward, on every device."""
import math

import numpy as np
import pytest

import tallow

torch = pytest.importorskip("torch")


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
