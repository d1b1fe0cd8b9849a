"""The op suite: every tensor op on every available device, against numpy and PyTorch."""
import math

import numpy as np
import pytest

import tallow
from tallow import functional as F

from device_limits import NARROW_INTS, NO_DTYPE

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2, "f64": 1e-12}


def rnd(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def T(a, device):
    return tallow.from_numpy(np.asarray(a), device=device)


def close(t, ref, tol=1e-5, atol=None):
    assert isinstance(t, tallow.Tensor)
    got = t.numpy()
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol,
                               atol=tol if atol is None else atol)


def tt(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---- creation and conversion ---------------------------------------------------------------
def test_creation(device):
    assert tallow.zeros(2, 3, device=device).tolist() == [[0.0] * 3] * 2
    assert tallow.ones((2,), dtype=tallow.i32, device=device).tolist() == [1, 1]
    assert tallow.full((2, 2), 7, device=device).dtype is tallow.i64
    assert tallow.arange(5, device=device).tolist() == [0, 1, 2, 3, 4]
    close(tallow.arange(0.0, 1.0, 0.25, device=device), np.arange(0.0, 1.0, 0.25))
    close(tallow.linspace(0, 1, 5, device=device), np.linspace(0, 1, 5))
    close(tallow.eye(3, device=device), np.eye(3))
    x = tallow.tensor([[1, 2], [3, 4]], device=device)
    assert x.dtype is tallow.i64 and x.shape == (2, 2) and x.ndim == 2 and x.numel() == 4
    assert tallow.tensor(3.5, device=device).item() == 3.5
    assert tallow.tensor([True, False], device=device).dtype is tallow.bool_
    assert tallow.zeros_like(x).tolist() == [[0, 0], [0, 0]]
    assert tallow.ones_like(x, dtype=tallow.f32).dtype is tallow.f32
    b = bytes(tallow.tensor([1.0, -2.0], device=device))
    assert b == np.array([1.0, -2.0], np.float32).tobytes()
    assert tallow.from_buffer(b, "f32", (2,), device=device).tolist() == [1.0, -2.0]
    with pytest.raises(tallow.FormatError):
        tallow.from_buffer(b[:7], "f32", (2,), device=device)
    with pytest.raises(tallow.ShapeError):
        tallow.tensor([[1, 2], [3]], device=device)


def test_random_is_seeded(device):
    tallow.manual_seed(1)
    a = tallow.randn(3, 4, device=device).tolist()
    tallow.manual_seed(1)
    assert tallow.randn(3, 4, device=device).tolist() == a
    r = tallow.rand(1000, device=device).numpy()
    assert 0 <= r.min() and r.max() < 1 and abs(r.mean() - 0.5) < 0.05


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64", "u32", "bool"])
def test_dtype_roundtrip(device, name):
    dt = tallow.get_dtype(name)
    if (device.type, name) in NO_DTYPE:  # WebGPU and Metal have no f64: refused, never silently narrowed
        with pytest.raises(tallow.UnsupportedError, match=name):
            tallow.tensor([1.0], dtype=dt, device=device)
        return
    values = [0, 1, 2, 100] if dt.kind in "iu" else ([True, False] if dt.kind == "b" else [0.0, 1.5, -2.25, 1e-3])
    x = tallow.tensor(values, dtype=dt, device=device)
    assert x.dtype is dt and len(bytes(x)) == dt.itemsize * len(values)
    if dt.kind == "f":
        ref = torch.tensor(values, dtype={"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                                          "f64": torch.float64}[name])
        assert bytes(x) == ref.view(torch.uint8).numpy().tobytes() if name != "f64" else True
        close(x, ref.double().numpy(), TOL[name])


def test_bf16_rounds_to_nearest_even(device):
    vals = np.array([1.00390625, 1.01171875, 3.14159265, -65504.0, 1e-20], np.float32)
    got = tallow.tensor(vals.tolist(), dtype=tallow.bf16, device=device)
    ref = torch.from_numpy(vals).to(torch.bfloat16)
    assert bytes(got) == ref.view(torch.int16).numpy().tobytes()
    s = got + got
    assert bytes(s) == (ref + ref).view(torch.int16).numpy().tobytes()


def test_casts(device):
    a = rnd(3, 4) * 10
    x = T(a, device)
    assert x.to(tallow.i32).tolist() == a.astype(np.int32).tolist()
    close(x.to(tallow.f16), a.astype(np.float16), 1e-3)
    assert x.gt(0).to(tallow.f32).tolist() == (a > 0).astype(np.float32).tolist()
    assert (x > 0).dtype is tallow.bool_


def test_promotion(device):
    i = tallow.tensor([1, 2], dtype=tallow.i32, device=device)
    f = tallow.tensor([0.5, 0.5], dtype=tallow.f16, device=device)
    assert (i + f).dtype is tallow.f16
    assert (i + 1).dtype is tallow.i32
    assert (i * 1.5).dtype is tallow.f32
    assert (i / 2).dtype is tallow.f32 and (i / 2).tolist() == [0.5, 1.0]
    assert (f + tallow.tensor([1.0], dtype=tallow.bf16, device=device)).dtype is tallow.f32
    assert (tallow.tensor([1], dtype=tallow.u8, device=device)
            + tallow.tensor([1], dtype=tallow.i8, device=device)).dtype is tallow.i32


# ---- views -------------------------------------------------------------------------------------
def test_views(device):
    a = rnd(2, 3, 4)
    x = T(a, device)
    close(x.transpose(0, 2), a.transpose(2, 1, 0))
    close(x.permute(1, 2, 0), a.transpose(1, 2, 0))
    close(x.reshape(6, 4), a.reshape(6, 4))
    close(x.reshape(-1), a.reshape(-1))
    close(x.transpose(1, 2).reshape(2, 12), a.transpose(0, 2, 1).reshape(2, 12))
    close(x.narrow(2, 1, 2), a[:, :, 1:3])
    close(x[:, 0].unsqueeze(1), a[:, 0][:, None])
    close(x.unsqueeze(0).squeeze(0), a)
    close(x[:1].squeeze(), a[0])
    close(x[:, :1].expand(2, 5, 4), np.broadcast_to(a[:, :1], (2, 5, 4)))
    close(x.flatten(1), a.reshape(2, 12))
    close(x[0].T, a[0].T)
    assert not x.transpose(0, 1).is_contiguous() and x.transpose(0, 1).contiguous().is_contiguous()
    assert x.strides == (12, 4, 1)
    with pytest.raises(tallow.ShapeError):
        x.reshape(5, 5)
    with pytest.raises(tallow.ShapeError):
        x.narrow(0, 1, 5)


def test_getitem(device):
    a = rnd(4, 5, 6)
    x = T(a, device)
    for key in [1, -1, (slice(1, 3),), (slice(None), 2), (Ellipsis, 1), (None, 0),
                (slice(0, 5, 2), slice(None), slice(1, None, 3)),
                (1, Ellipsis, None), (slice(3, 1),)]:
        close(x[key], a[key])
    close(x[[2, 0, 3]], a[[2, 0, 3]])
    close(x[:, [4, 0]], a[:, [4, 0]])
    close(x[tallow.tensor([[1, 2], [3, 0]], device=device)], a[np.array([[1, 2], [3, 0]])])
    mask = a[:, 0, 0] > 0
    close(x[T(mask, device)], a[mask])
    close(x[T(a > 0.5, device)], a[a > 0.5])
    with pytest.raises(tallow.ShapeError):
        x[4]
    with pytest.raises(tallow.ShapeError):
        x[0, 0, 0, 0]


def test_setitem(device):
    a = rnd(4, 5)
    x = T(a, device)
    x[1:3, ::2] = tallow.zeros(2, 3, device=device)
    x[0] = 7.0
    a[1:3, ::2] = 0
    a[0] = 7
    close(x, a)


# ---- element-wise ----------------------------------------------------------------------------------
UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0), "square": np.square,
    "silu": lambda v: v / (1 + np.exp(-v)), "floor": np.floor, "ceil": np.ceil, "sign": np.sign,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(device, op):
    a = rnd(3, 5)
    x = T(a, device).transpose(0, 1)  # non-contiguous input
    close(getattr(x, op)(), UNARY[op](a.T), 1e-5)


def test_unary_positive_domain(device):
    a = np.abs(rnd(4, 3)) + 0.1
    x = T(a, device)
    close(x.log(), np.log(a))
    close(x.sqrt(), np.sqrt(a))
    close(x.rsqrt(), 1 / np.sqrt(a))
    close(x.reciprocal(), 1 / a)
    close(x ** 1.5, a ** 1.5)
    close(2.0 ** x, 2.0 ** a)
    close(x.clamp(0.5, 1.0), np.clip(a, 0.5, 1.0))
    close(x.clamp(min=0.7), np.clip(a, 0.7, None))
    close(x.affine(2.0, 1.0), a * 2 + 1)


def test_gelu_against_torch(device):
    a = rnd(64) * 3
    x = T(a, device)
    close(x.gelu(), torch.nn.functional.gelu(tt(a)).numpy(), 1e-5)
    close(x.gelu("tanh"), torch.nn.functional.gelu(tt(a), approximate="tanh").numpy(), 1e-5)
    close(x.sigmoid(), torch.sigmoid(tt(a)).numpy(), 1e-5)
    big = T(np.array([-100.0, 100.0], np.float32), device)
    close(big.sigmoid(), [0.0, 1.0])


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5,), ()), ((0, 3), (1, 3)),
                                    ((), ())])
def test_binary_broadcast(device, shapes):
    sa, sb = shapes
    a, b = rnd(*sa), rnd(*sb) + 3.0
    x, y = T(a, device), T(b, device)
    for f in (lambda p, q: p + q, lambda p, q: p - q, lambda p, q: p * q, lambda p, q: p / q):
        close(f(x, y), f(a, b))
    close(x.maximum(y), np.maximum(a, b))
    close(x.minimum(y), np.minimum(a, b))
    assert (x < y).tolist() == (a < b).tolist()
    assert x.eq(x).numpy().all()
    close(x + 1, a + 1)
    close(1 - x, 1 - a)
    close(2 / y, 2 / b)
    close(-x, -a)


def test_where_masked_fill(device):
    a, b = rnd(3, 4), rnd(4)
    c = a > 0
    close(tallow.where(T(c, device), T(a, device), T(b, device)), np.where(c, a, b))
    close(tallow.where(T(c, device), T(a, device), 0.0), np.where(c, a, 0.0))
    close(T(a, device).masked_fill(T(c, device), -1.0), np.where(c, -1.0, a))


def test_integer_ops(device):
    a = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    b = RNG.integers(1, 9, (4,)).astype(np.int32)
    x, y = T(a, device), T(b, device)
    assert (x + y).tolist() == (a + b).tolist()
    assert (x * y).tolist() == (a * b).tolist()
    assert (x - 3).tolist() == (a - 3).tolist()
    assert x.abs().tolist() == np.abs(a).tolist()
    assert x.sum().item() == int(a.sum())
    assert x.max(1).tolist() == a.max(1).tolist()


# ---- reductions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
def test_reductions(device, dim, keepdim):
    a = rnd(3, 4, 5)
    x = T(a, device).permute(1, 0, 2)  # non-contiguous
    ref = a.transpose(1, 0, 2)
    ax = dim if not isinstance(dim, list) else tuple(dim)
    close(x.sum(dim, keepdim), ref.sum(axis=ax, keepdims=keepdim), 1e-5)
    close(x.mean(dim, keepdim), ref.mean(axis=ax, keepdims=keepdim), 1e-5)
    close(x.max(dim, keepdim), ref.max(axis=ax, keepdims=keepdim))
    close(x.min(dim, keepdim), ref.min(axis=ax, keepdims=keepdim))
    close(x.var(dim, keepdim), ref.var(axis=ax, keepdims=keepdim, ddof=1), 1e-4)
    close(x.std(dim, keepdim), ref.std(axis=ax, keepdims=keepdim, ddof=1), 1e-4)


def test_arg_reductions_and_cumsum(device):
    a = rnd(4, 6)
    x = T(a, device)
    assert x.argmax(1).tolist() == a.argmax(1).tolist()
    assert x.argmin(0).tolist() == a.argmin(0).tolist()
    assert x.argmax().item() == int(a.argmax())
    assert x.argmax(1, keepdim=True).shape == (4, 1)
    close(x.cumsum(1), np.cumsum(a, 1), 1e-5)
    close(x.T.cumsum(0), np.cumsum(a.T, 0), 1e-5)
    assert tallow.tensor([1, 2, 3], device=device).cumsum(0).tolist() == [1, 3, 6]
    assert tallow.tensor([[True, False, True]], device=device).sum().item() == 2
    close(tallow.zeros(0, 3, device=device).sum(0), np.zeros(3))
    with pytest.raises(tallow.ShapeError):
        tallow.zeros(0, 3, device=device).max(0)


# ---- linear algebra ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 3)),
                                   ((3, 4), (4,)), ((0, 4), (4, 2))])
def test_matmul(device, sa, sb):
    a, b = rnd(*sa), rnd(*sb)
    close(T(a, device) @ T(b, device), np.matmul(a, b), 1e-4)


def test_matmul_transposed_and_errors(device):
    a, b = rnd(5, 3), rnd(4, 5)
    close(T(a, device).T @ T(b, device).T, a.T @ b.T, 1e-4)
    with pytest.raises(tallow.ShapeError, match=r"\(2, 3\) and \(2, 3\)"):
        tallow.ones((2, 3), device=device) @ tallow.ones((2, 3), device=device)


def test_cat_stack_split_chunk_pad(device):
    a, b = rnd(2, 3), rnd(2, 5)
    x, y = T(a, device), T(b, device)
    close(tallow.cat([x, y], 1), np.concatenate([a, b], 1))
    close(tallow.cat([x.T, T(rnd(1, 2), device)], 0).shape and tallow.cat([x, x], 0), np.concatenate([a, a], 0))
    close(tallow.stack([x, x * 2], 1), np.stack([a, a * 2], 1))
    parts = y.split(2, 1)
    assert [p.shape for p in parts] == [(2, 2), (2, 2), (2, 1)]
    close(parts[2], b[:, 4:])
    assert [c.shape for c in y.chunk(2, 1)] == [(2, 3), (2, 2)]
    close(tallow.pad(x, (1, 2)), np.pad(a, ((0, 0), (1, 2))))
    close(tallow.pad(x, (1, 0, 0, 1), value=3.0), np.pad(a, ((0, 1), (1, 0)), constant_values=3.0))
    with pytest.raises(tallow.ShapeError):
        tallow.cat([x, T(rnd(3, 3), device)], 1)


def test_index_select_gather_scatter(device):
    a = rnd(5, 4)
    x = T(a, device)
    ids = np.array([4, 0, 0, 2])
    close(x.index_select(0, tallow.tensor(ids.tolist(), device=device)), a[ids])
    close(x.T.index_select(1, tallow.tensor([1, 3], device=device)), a.T[:, [1, 3]])
    g = RNG.integers(0, 4, (5, 3))
    close(x.gather(1, T(g, device)), torch.gather(tt(a), 1, tt(g)).numpy())
    src = rnd(5, 3)
    dst = np.zeros((5, 4), np.float32)
    ref = torch.zeros(5, 4).scatter_add(1, tt(g), tt(src)).numpy()
    close(T(dst, device).scatter_add(1, T(g, device), T(src, device)), ref, 1e-5)


# ---- nn ops vs torch ---------------------------------------------------------------------------------------------
def test_softmax_family(device):
    a = rnd(3, 7) * 4
    x = T(a, device)
    close(x.softmax(-1), torch.softmax(tt(a), -1).numpy(), 1e-5)
    close(x.softmax(0), torch.softmax(tt(a), 0).numpy(), 1e-5)
    close(x.log_softmax(-1), torch.log_softmax(tt(a), -1).numpy(), 1e-5)


def test_norms(device):
    a, w, b = rnd(2, 3, 16), rnd(16), rnd(16)
    x = T(a, device)
    close(F.layer_norm(x, T(w, device), T(b, device), 1e-5),
          torch.nn.functional.layer_norm(tt(a), (16,), tt(w), tt(b), 1e-5).numpy(), 1e-4)
    close(F.layer_norm(x), torch.nn.functional.layer_norm(tt(a), (16,)).numpy(), 1e-4)
    ref = tt(a) * torch.rsqrt(tt(a).pow(2).mean(-1, keepdim=True) + 1e-6) * tt(w)
    close(F.rms_norm(x, T(w, device), 1e-6), ref.numpy(), 1e-4)
    with pytest.raises(tallow.ShapeError):
        F.layer_norm(x, T(rnd(8), device))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2), (1, 1, 1, 4)])
def test_conv1d(device, stride, padding, dilation, groups):
    x, w, b = rnd(2, 4, 11), rnd(8, 4 // groups, 3), rnd(8)
    ref = torch.nn.functional.conv1d(tt(x), tt(w), tt(b), stride, padding, dilation, groups).numpy()
    close(F.conv1d(T(x, device), T(w, device), T(b, device), stride, padding, dilation, groups), ref, 1e-4)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), ((2, 1), (1, 2), 1, 2)])
def test_conv2d(device, stride, padding, dilation, groups):
    x, w = rnd(1, 4, 7, 6), rnd(6, 4 // groups, 3, 2)
    ref = torch.nn.functional.conv2d(tt(x), tt(w), None, stride, padding, dilation, groups).numpy()
    close(F.conv2d(T(x, device), T(w, device), None, stride, padding, dilation, groups), ref, 1e-4)


def _torch_rope(x, cos, sin, interleaved):
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
        return out.flatten(-2)
    h = x.shape[-1] // 2
    c, s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * c + rot * s


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary(device, interleaved):
    x = rnd(1, 2, 5, 8)
    ang = np.arange(5)[:, None] * (10000 ** (-np.arange(4) / 4))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    ref = _torch_rope(tt(x), tt(cos), tt(sin), interleaved).numpy()
    close(F.rotary_emb(T(x, device), T(cos, device), T(sin, device), interleaved), ref, 1e-5)


@pytest.mark.parametrize("causal,mask,tq,hk", [(False, False, 4, 2), (True, False, 4, 2), (False, True, 3, 2),
                                               (True, False, 2, 1)])
def test_attention(device, causal, mask, tq, hk):
    q, k, v = rnd(1, 2, tq, 8), rnd(1, hk, 6, 8), rnd(1, hk, 6, 8)
    m = rnd(1, 1, tq, 6) if mask else None
    kr, vr = tt(k).repeat_interleave(2 // hk, 1), tt(v).repeat_interleave(2 // hk, 1)
    if causal:  # torch's is_causal aligns top-left; ours aligns the last query with the last key (KV cache)
        allowed = torch.ones(tq, 6, dtype=torch.bool).tril(6 - tq)
        ref = torch.nn.functional.scaled_dot_product_attention(tt(q), kr, vr, attn_mask=allowed)
    else:
        ref = torch.nn.functional.scaled_dot_product_attention(tt(q), kr, vr, attn_mask=None if m is None else tt(m))
    got = F.scaled_dot_product_attention(T(q, device), T(k, device), T(v, device), None if m is None else T(m, device),
                                         is_causal=causal)
    close(got, ref.numpy(), 1e-4)


# ---- errors ----------------------------------------------------------------------------------------------------------
def test_errors(device):
    x = tallow.ones((2, 3), device=device)
    with pytest.raises(tallow.ShapeError, match="broadcast"):
        x + tallow.ones((4,), device=device)
    with pytest.raises(tallow.ShapeError):
        x.sum(5)
    with pytest.raises(tallow.ShapeError):
        x.item()
    with pytest.raises(tallow.DTypeError):
        tallow.tensor(["a"], device=device)
    with pytest.raises(tallow.DTypeError):
        x.index_select(0, tallow.tensor([0.5], device=device))
    assert isinstance(tallow.ShapeError("x"), tallow.Error)


@pytest.mark.parametrize("op,bad", [("index_select", -1), ("index_select", 5), ("gather", -1), ("gather", 4),
                                    ("scatter_add", 4), ("embedding", -1), ("embedding", 5)])
def test_ids_out_of_range(device, op, bad):
    """Every backend refuses an id outside [0, size) with one tallow error (torch refuses them too;
    numpy would wrap -1), naming the op, the id and the valid range."""
    a = rnd(5, 4)
    x = T(a, device)
    ids = [0, bad, 1]
    if op == "index_select":
        dim, run, ref = 0, lambda: x.index_select(0, tallow.tensor(ids, device=device)), \
            lambda: torch.index_select(tt(a), 0, torch.tensor(ids))
    elif op == "gather":
        dim, run, ref = 1, lambda: x.gather(1, tallow.tensor([ids], device=device)), \
            lambda: torch.gather(tt(a), 1, torch.tensor([ids]))
    elif op == "scatter_add":
        src = rnd(1, 3)
        dim, run, ref = 1, lambda: x.scatter_add(1, tallow.tensor([ids], device=device), T(src, device)), \
            lambda: tt(a).scatter_add(1, torch.tensor([ids]), tt(src))
    else:
        dim, run, ref = 0, lambda: F.embedding(tallow.tensor([ids], device=device), x), \
            lambda: torch.nn.functional.embedding(torch.tensor([ids]), tt(a))
    with pytest.raises((IndexError, RuntimeError)):
        ref()
    size = a.shape[dim]
    with pytest.raises(tallow.IndexRangeError, match=rf"{op}: .*{bad} is out of range for dim {dim} of size {size} "
                                                     rf"\(valid: 0 to {size - 1}\)") as e:
        run()
    assert isinstance(e.value, IndexError) and isinstance(e.value, tallow.ShapeError)


def test_ids_wrong_dtype_and_in_range(device):
    x = T(rnd(5, 4), device)
    for ids in (tallow.tensor([0.0, 1.0], device=device), tallow.tensor([True, False], device=device)):
        with pytest.raises(tallow.DTypeError, match="must be an integer tensor"):
            x.index_select(0, ids)
        with pytest.raises(tallow.DTypeError, match="must be an integer tensor"):
            F.embedding(ids, x)
    for dtype in (tallow.i64, tallow.i32, tallow.u8, tallow.i8, tallow.u32):  # the edges of the range pass
        assert x.index_select(0, tallow.tensor([4, 0], dtype, device)).shape == (2, 4)
    assert x[[-1]].shape == (1, 4)  # Python-style negative indexing stays (t[...] is not index_select)
    with pytest.raises(tallow.IndexRangeError, match=r"index 5 is out of range for dim 0 of size 5"):
        x[[5]]


@pytest.mark.parametrize("value,dtype", [(2 ** 40, "i32"), (2 ** 40, "u8"), (-1, "u32"), (-1, "u8"), (256, "u8"),
                                         (-129, "i8"), (2 ** 63, "i64"), (2 ** 32, "u32")])
def test_int_out_of_range_for_dtype(device, value, dtype):
    """numpy refuses these (OverflowError; torch even wraps -1 into uint8); tallow says which
    value and dtype on every backend, instead of a backend's own error or a wrap-around."""
    with pytest.raises(OverflowError):
        np.array([value], dtype=tallow.get_dtype(dtype).np_name)
    with pytest.raises(tallow.ValueRangeError, match=rf"tensor: {value} is out of range for {dtype}"):
        tallow.tensor([1, value], dtype=dtype, device=device)
    with pytest.raises(tallow.ValueRangeError, match=rf"full: {value} is out of range for {dtype}"):
        tallow.full((2,), value, dtype=dtype, device=device)
    with pytest.raises(OverflowError):  # still what plain Python code expects
        tallow.tensor(value, dtype=dtype, device=device)


def test_int_range_edges_and_non_finite(device):
    assert tallow.tensor([2 ** 31 - 1, -2 ** 31], dtype="i32", device=device).tolist() == [2 ** 31 - 1, -2 ** 31]
    assert tallow.tensor([0, 255], dtype="u8", device=device).tolist() == [0, 255]
    if (device.type, "i64") in NARROW_INTS:  # wgpu keeps i64 as i32 on the GPU, and says so
        with pytest.raises(tallow.UnsupportedError, match="outside the i32 range"):
            tallow.tensor([2 ** 63 - 1], device=device)
        top = tallow.tensor([2 ** 31 - 1], device=device)
        with pytest.raises(tallow.UnsupportedError, match="leaves the i32 range"):  # never a 32-bit wrap
            top + 1
        assert (top - 1).tolist() == [2 ** 31 - 2] and top.sum().item() == 2 ** 31 - 1
    else:
        assert tallow.tensor([2 ** 63 - 1], device=device).tolist() == [2 ** 63 - 1]
        assert (tallow.tensor([2 ** 31 - 1], device=device) + 1).tolist() == [2 ** 31]
    assert tallow.tensor([-0.5, 2.9], dtype="u8", device=device).tolist() == [0, 2]  # truncated, as torch does
    for v in (float("nan"), float("inf")):
        with pytest.raises(tallow.ValueRangeError, match="not a finite number"):
            tallow.tensor([v], dtype="i64", device=device)


def test_two_devices_error(device):
    other = "python" if device.type != "python" else "cpu"
    try:
        y = tallow.ones(2, device=other)
    except tallow.DeviceError:
        pytest.skip(f"{other} not available")
    with pytest.raises(tallow.DeviceError, match="different devices"):
        tallow.ones(2, device=device) + y
    assert (tallow.ones(2, device=device) + y.to(device)).tolist() == [2.0, 2.0]


def test_zero_size_and_scalar(device):
    z = tallow.zeros(0, 4, device=device)
    assert (z + 1).shape == (0, 4) and z.T.shape == (4, 0) and z.tolist() == []
    assert (tallow.zeros(3, 0, device=device) @ tallow.zeros(0, 2, device=device)).tolist() == [[0.0, 0.0]] * 3
    s = tallow.tensor(2.0, device=device)
    assert s.shape == () and (s * s).item() == 4.0 and float(s.exp()) == pytest.approx(math.e ** 2, rel=1e-6)
