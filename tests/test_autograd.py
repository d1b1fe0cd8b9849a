"""Gradients against torch.autograd on random inputs, on every device; f64 finite differences."""
import numpy as np
import pytest

import tallow
from tallow import functional as F

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(1)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check(device, fn_tallow, fn_torch, *arrays, tol=1e-4):
    """Run fn on leaves that require grad in both libraries; compare the value and every gradient."""
    ours = [tallow.from_numpy(a, device).requires_grad_() for a in arrays]
    theirs = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
    out = fn_tallow(*ours)
    ref = fn_torch(*theirs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=tol, atol=tol)
    seed = rnd(*ref.shape) if ref.shape else np.array(1.0, np.float32)
    out.backward(tallow.from_numpy(seed, device))
    ref.backward(torch.from_numpy(seed))
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert o.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol, err_msg=f"gradient of input {i}")


def test_elementwise_broadcast(device):
    check(device, lambda a, b: (a * b + a / (b.abs() + 1.0) - b).exp().sum(0),
          lambda a, b: (a * b + a / (b.abs() + 1.0) - b).exp().sum(0), rnd(3, 4), rnd(4))


@pytest.mark.parametrize("op", ["tanh", "sigmoid", "relu", "silu", "sin", "cos", "square", "neg", "abs", "expm1"])
def test_unary(device, op):
    ref = torch.nn.functional.silu if op == "silu" else (lambda a: getattr(a, op)())
    check(device, lambda a: getattr(a, op)(), ref, rnd(5, 3))


def test_gelu_both_forms(device):
    check(device, lambda a: a.gelu(), lambda a: torch.nn.functional.gelu(a), rnd(17))
    check(device, lambda a: a.gelu("tanh"), lambda a: torch.nn.functional.gelu(a, approximate="tanh"), rnd(17))


def test_positive_domain(device):
    a = np.abs(rnd(4, 3)) + 0.5
    check(device, lambda x: x.log() + x.sqrt() + x.rsqrt() + x.reciprocal() + x ** 1.5 + x.clamp(0.7, 1.2),
          lambda x: x.log() + x.sqrt() + x.rsqrt() + x.reciprocal() + x ** 1.5 + x.clamp(0.7, 1.2), a)
    check(device, lambda x, y: x ** y, lambda x, y: x ** y, a, rnd(3))


def test_reductions(device):
    check(device, lambda a: a.sum(1, keepdim=True) * a.mean(0), lambda a: a.sum(1, keepdim=True) * a.mean(0), rnd(3, 5))
    check(device, lambda a: a.max(1) + a.min(0).sum(), lambda a: a.amax(1) + a.amin(0).sum(), rnd(4, 6))
    check(device, lambda a: a.var(1) + a.std(0).sum(), lambda a: a.var(1) + a.std(0).sum(), rnd(4, 6))
    check(device, lambda a: a.cumsum(1), lambda a: a.cumsum(1), rnd(3, 5))


def test_views_and_indexing(device):
    check(device, lambda a: a.transpose(0, 1).reshape(4, 3)[1:, ::2] * 2,
          lambda a: a.transpose(0, 1).reshape(4, 3)[1:, ::2] * 2, rnd(3, 4))
    check(device, lambda a: a.permute(2, 0, 1).unsqueeze(0).squeeze(0).narrow(1, 1, 2).expand(2, 2, 2, 3).sum(0),
          lambda a: a.permute(2, 0, 1).unsqueeze(0).squeeze(0).narrow(1, 1, 2).expand(2, 2, 2, 3).sum(0), rnd(3, 1, 2))
    check(device, lambda a: a[[2, 0, 2]], lambda a: a[[2, 0, 2]], rnd(4, 3))
    check(device, lambda a: a[..., 1, None], lambda a: a[..., 1, None], rnd(2, 3, 4))


def test_matmul_batched(device):
    check(device, lambda a, b: a @ b, lambda a, b: a @ b, rnd(2, 3, 4), rnd(4, 5))
    check(device, lambda a, b: a @ b, lambda a, b: a @ b, rnd(4), rnd(2, 4, 3))


def test_gather_scatter_index_select_where(device):
    idx = RNG.integers(0, 4, (3, 2))
    check(device, lambda a: a.gather(1, tallow.tensor(idx.tolist(), device=device)),
          lambda a: a.gather(1, torch.from_numpy(idx)), rnd(3, 4))
    check(device, lambda a, s: a.scatter_add(1, tallow.tensor(idx.tolist(), device=device), s),
          lambda a, s: a.scatter_add(1, torch.from_numpy(idx), s), rnd(3, 4), rnd(3, 2))
    check(device, lambda a: a.index_select(0, tallow.tensor([1, 1, 0], device=device)),
          lambda a: a.index_select(0, torch.tensor([1, 1, 0])), rnd(2, 3))
    m = rnd(3, 4) > 0
    check(device, lambda a, b: tallow.where(tallow.from_numpy(m, device), a, b),
          lambda a, b: torch.where(torch.from_numpy(m), a, b), rnd(3, 4), rnd(4))


def test_cat_stack_pad_split(device):
    check(device, lambda a, b: tallow.cat([a, b, a], 1), lambda a, b: torch.cat([a, b, a], 1), rnd(2, 3), rnd(2, 1))
    check(device, lambda a, b: tallow.stack([a, b], 0), lambda a, b: torch.stack([a, b], 0), rnd(2, 3), rnd(2, 3))
    check(device, lambda a: tallow.pad(a, (1, 2, 0, 1)), lambda a: torch.nn.functional.pad(a, (1, 2, 0, 1)), rnd(2, 3))
    check(device, lambda a: a.split(2, 1)[1] * 3, lambda a: a.split(2, 1)[1] * 3, rnd(2, 5))


def test_nn_ops(device):
    check(device, lambda a: a.softmax(-1), lambda a: a.softmax(-1), rnd(3, 5))
    check(device, lambda a: a.log_softmax(0), lambda a: a.log_softmax(0), rnd(3, 5))
    check(device, lambda a, w, b: F.layer_norm(a, w, b), lambda a, w, b: torch.nn.functional.layer_norm(a, (6,), w, b),
          rnd(2, 6), rnd(6), rnd(6))
    check(device, lambda a, w: F.rms_norm(a, w, 1e-6),
          lambda a, w: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * w, rnd(2, 6), rnd(6))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 0, 2, 2)])
def test_conv(device, stride, padding, dilation, groups):
    check(device, lambda x, w, b: F.conv1d(x, w, b, stride, padding, dilation, groups),
          lambda x, w, b: torch.nn.functional.conv1d(x, w, b, stride, padding, dilation, groups),
          rnd(2, 4, 9), rnd(6, 4 // groups, 3), rnd(6))
    check(device, lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups),
          lambda x, w: torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups),
          rnd(1, 4, 7, 6), rnd(2, 4 // groups, 2, 3))


def test_attention_and_rope(device):
    check(device, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
          rnd(1, 2, 4, 8), rnd(1, 2, 4, 8), rnd(1, 2, 4, 8))
    ang = np.arange(3)[:, None] * np.array([1.0, 0.1], np.float32)[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def ref(x):
        c, s = torch.from_numpy(np.concatenate([cos, cos], -1)), torch.from_numpy(np.concatenate([sin, sin], -1))
        return x * c + torch.cat([-x[..., 2:], x[..., :2]], -1) * s
    check(device, lambda x: F.rotary_emb(x, tallow.from_numpy(cos, device), tallow.from_numpy(sin, device)), ref,
          rnd(1, 2, 3, 4))


def test_finite_differences_f64(device):
    if device.type == "wgpu":
        pytest.skip("WebGPU has no f64 (the wgpu backend refuses it); the f32 gradient checks above cover wgpu")
    a = RNG.standard_normal((3, 4))
    x = tallow.from_numpy(a, device).requires_grad_()

    def f(t):
        return ((t @ t.T).tanh().sum(0) * t.softmax(-1).sum(1)).sum()
    f(x).backward()
    eps = 1e-6
    num = np.zeros_like(a)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            p, m = a.copy(), a.copy()
            p[i, j] += eps
            m[i, j] -= eps
            num[i, j] = (f(tallow.from_numpy(p, device)).item() - f(tallow.from_numpy(m, device)).item()) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), num, rtol=1e-6, atol=1e-7)


def test_no_tape_without_requires_grad(device):
    a = tallow.ones(2, 2, device=device)
    out = (a * 2).exp().sum()
    assert out._node is None and not out.requires_grad
    w = tallow.ones(2, 2, device=device).requires_grad_()
    with tallow.no_grad():
        y = (w * 2).sum()
    assert y._node is None
    with pytest.raises(tallow.Error):
        out.backward()
    with pytest.raises(tallow.DTypeError):
        tallow.tensor([1, 2], device=device).requires_grad_()


def test_requires_grad_at_creation_gives_torch_gradients(device):
    """`requires_grad=True` on every float creation function: a leaf whose gradients equal torch's."""
    a = rnd(3, 4)
    made = {
        "tensor": (tallow.tensor(a.tolist(), device=device, requires_grad=True),
                   torch.tensor(a.tolist(), requires_grad=True)),
        "from_numpy": (tallow.from_numpy(a, device, requires_grad=True), torch.tensor(a, requires_grad=True)),
        "zeros": (tallow.zeros(3, 4, device=device, requires_grad=True), torch.zeros(3, 4, requires_grad=True)),
        "ones": (tallow.ones((3, 4), device=device, requires_grad=True), torch.ones(3, 4, requires_grad=True)),
        "empty": (tallow.empty(3, 4, device=device, requires_grad=True), torch.zeros(3, 4, requires_grad=True)),
        "full": (tallow.full((3, 4), 0.5, device=device, requires_grad=True),
                 torch.full((3, 4), 0.5, requires_grad=True)),
        "rand": (tallow.rand(3, 4, device=device, requires_grad=True), None),
        "randn": (tallow.randn(3, 4, device=device, requires_grad=True), None),
        "arange": (tallow.arange(0.0, 12.0, device=device, requires_grad=True),
                   torch.arange(0.0, 12.0, requires_grad=True)),
        "linspace": (tallow.linspace(0, 1, 12, device=device, requires_grad=True),
                     torch.linspace(0, 1, 12, requires_grad=True)),
        "eye": (tallow.eye(3, 4, device=device, requires_grad=True), torch.eye(3, 4, requires_grad=True)),
        "zeros_like": (tallow.zeros_like(tallow.from_numpy(a, device), requires_grad=True),
                       torch.zeros_like(torch.from_numpy(a), requires_grad=True)),
        "ones_like": (tallow.ones_like(tallow.from_numpy(a, device), requires_grad=True),
                      torch.ones_like(torch.from_numpy(a), requires_grad=True)),
        "full_like": (tallow.full_like(tallow.from_numpy(a, device), 2.0, requires_grad=True),
                      torch.full_like(torch.from_numpy(a), 2.0, requires_grad=True)),
    }
    weight = rnd(4)
    for name, (ours, theirs) in made.items():
        if theirs is None:  # tallow's random stream is its own: torch starts from the same values
            theirs = torch.from_numpy(ours.numpy().copy()).requires_grad_()
        assert ours.requires_grad and ours.grad is None, name
        x, y = ours.reshape(3, 4), theirs.reshape(3, 4)
        ((x * x).sin() * tallow.from_numpy(weight, device)).sum().backward()
        ((y * y).sin() * torch.from_numpy(weight)).sum().backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    # A tensor made from another is a new leaf, cut from the graph of its source (as torch.tensor does).
    src = tallow.from_numpy(a, device, requires_grad=True)
    copy = tallow.tensor(src * 2, requires_grad=True)
    (copy * 3).sum().backward()
    assert src.grad is None and np.allclose(copy.grad.numpy(), 3)
    assert not tallow.zeros(2, device=device).requires_grad


@pytest.mark.parametrize("make", [
    lambda: tallow.tensor([1, 2], requires_grad=True),
    lambda: tallow.tensor([1.0], dtype=tallow.i32, requires_grad=True),
    lambda: tallow.zeros(2, dtype=tallow.i64, requires_grad=True),
    lambda: tallow.full((2,), True, requires_grad=True),
    lambda: tallow.arange(5, requires_grad=True),
    lambda: tallow.from_numpy(np.arange(3), requires_grad=True),
])
def test_requires_grad_at_creation_refuses_integer_dtypes(make):
    with pytest.raises(tallow.DTypeError, match="requires_grad=True needs a float dtype"):
        make()
    with pytest.raises(RuntimeError, match="floating point"):  # torch refuses the same
        torch.tensor([1, 2], requires_grad=True)
