"""f16 weights held as f16 on the wasm device (backend.f16_weight_products): ops.linear and
add_norm_linear pass an f16 weight to the device's matmul as it lies (gemm_f16 widens each value
exactly in the kernel), an f16 embedding table's rows are looked up as they lie, and
VarBuilder(keep_f16=...) keeps a checkpoint's 2-D f16 tensors f16. Every product equals the one
over the weight widened to f32 first (today's path: the same kernel order, the same values) bit
for bit, and numpy within f32 rounding; no f32 copy of the weight is made. Other devices keep
their behaviour (the capability is False by default: the weight is cast first)."""
import numpy as np
import pytest

import tallow
import tallow.functional as F
from tallow.backends.base import Backend
from tallow.nn import VarBuilder

pytest.importorskip("wasmtime", reason="the wasm device runs natively under wasmtime: pip install wasmtime")
from tallow.backends.wasm import build  # noqa: E402

if not __import__("os").path.exists(build.SHIPPED):
    pytest.skip("kernels.wasm is not built here: make wasm", allow_module_level=True)


@pytest.fixture(scope="module")
def wasm():
    return tallow.Device("wasm")


@pytest.fixture
def casts(wasm, monkeypatch):
    """The (from, to, count) of every cast the wasm backend makes while the test runs."""
    seen = []
    backend = wasm.backend
    real = type(backend).cast

    def cast(st, layout, src, dst):
        seen.append((src.name, dst.name, layout.numel()))
        return real(backend, st, layout, src, dst)
    monkeypatch.setattr(backend, "cast", cast)
    return seen


def _data(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("m,n,k", [(1, 200, 96), (5, 37, 64), (3, 16, 384), (300, 24, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_reads_an_f16_weight_as_it_lies_and_equals_the_widened_product(wasm, casts, m, n, k, with_bias):
    x = _data(1, m, k)
    w16 = (_data(2, n, k) * 0.5).astype(np.float16)
    b = _data(3, n) if with_bias else None
    X = tallow.tensor(x, device=wasm)
    W16 = tallow.tensor(w16, device=wasm)
    B = None if b is None else tallow.tensor(b, device=wasm)
    assert W16.dtype is tallow.f16
    got = F.linear(X, W16, B)
    assert got.dtype is tallow.f32 and got.shape == (m, n)
    # the weight was never widened to a copy, except for more rows than a GEMM block (program.GEMM_MB),
    # where one transient widening replaces gemm_f16's widening of every panel once per block
    assert bool([c for c in casts if c[2] == n * k]) == (m > 128), casts
    widened = F.linear(X, W16.to(tallow.f32), B).numpy()  # today's path: a cast, then gemm_f32
    assert [c for c in casts if c[2] == n * k]  # (the fixture sees the cast where there is one)
    assert np.array_equal(got.numpy(), widened)
    want = x.astype(np.float64) @ w16.astype(np.float64).T + (0 if b is None else b)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_batched_input_and_the_tied_projection_form(wasm, casts):
    """(b, t, k) inputs, and x @ table^T written as linear(x, table) (Whisper's tied logits)."""
    x = _data(4, 2, 3, 48)
    table = _data(5, 300, 48).astype(np.float16)
    T = tallow.tensor(table, device=wasm)
    got = F.linear(tallow.tensor(x, device=wasm), T)
    assert got.shape == (2, 3, 300) and not [c for c in casts if c[2] == 300 * 48]
    widened = F.linear(tallow.tensor(x, device=wasm), T.to(tallow.f32)).numpy()
    assert np.array_equal(got.numpy(), widened)


@pytest.mark.parametrize("act", [None, "gelu"])
def test_add_norm_linear_reads_an_f16_weight_as_it_lies(wasm, casts, act):
    m, k, n = 3, 64, 40
    x, r = _data(6, m, k), _data(7, m, k)
    nw, nb, bias = _data(8, k), _data(9, k), _data(10, n)
    w16 = (_data(11, n, k) * 0.3).astype(np.float16)
    T = lambda a: tallow.tensor(a, device=wasm)  # noqa: E731
    W16 = T(w16)
    hidden, y = F.add_norm_linear(T(x), T(r), T(nw), T(nb), W16, T(bias), kind="layer", eps=1e-5, act=act)
    assert not [c for c in casts if c[2] == n * k], casts
    hidden32, y32 = F.add_norm_linear(T(x), T(r), T(nw), T(nb), W16.to(tallow.f32), T(bias), kind="layer",
                                      eps=1e-5, act=act)
    assert np.array_equal(y.numpy(), y32.numpy()) and np.array_equal(hidden.numpy(), hidden32.numpy())
    h = x.astype(np.float64) + r
    normed = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * nw + nb
    want = normed @ w16.astype(np.float64).T + bias
    if act == "gelu":
        import math
        want = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(want)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_an_f16_tables_rows_are_looked_up_as_they_lie(wasm):
    table = _data(12, 50, 24).astype(np.float16)
    table[3, :4] = [np.inf, -np.inf, np.nan, -0.0]  # bits, not values: a copy keeps every pattern
    T = tallow.tensor(table, device=wasm)
    for ids in ([3, 0, 49, 3], [7]):
        rows = F.embedding(tallow.tensor(ids, dtype=tallow.i32, device=wasm), T)
        assert rows.dtype is tallow.f16
        assert rows.numpy().view(np.uint16).tolist() == table[ids].view(np.uint16).tolist()
    rows = F.embedding(tallow.tensor([[1, 2]], dtype=tallow.i64, device=wasm), T).to(tallow.f32)
    assert np.array_equal(rows.numpy(), table[[[1, 2]]].astype(np.float32))


def test_an_f16_table_of_odd_width_is_refused_naming_the_device(wasm):
    T = tallow.tensor(_data(13, 5, 3).astype(np.float16), device=wasm)
    with pytest.raises(tallow.UnsupportedError, match="wasm.*index_select of f16"):
        F.embedding(tallow.tensor([1], dtype=tallow.i32, device=wasm), T).numpy()


def test_other_devices_keep_casting_the_weight():
    assert Backend.f16_weight_products is False and tallow.Device("cpu").backend.f16_weight_products is False
    assert tallow.Device("wasm").backend.f16_weight_products is True
    x = _data(14, 2, 32)
    w16 = _data(15, 8, 32).astype(np.float16)
    got = F.linear(tallow.tensor(x), tallow.tensor(w16))
    assert got.dtype is tallow.f32
    np.testing.assert_allclose(got.numpy(), x @ w16.astype(np.float32).T, rtol=1e-5, atol=1e-5)


def test_var_builder_keeps_the_named_2d_f16_tensors_f16(wasm):
    src = {"a.weight": tallow.tensor(_data(16, 4, 8).astype(np.float16)),
           "b.weight": tallow.tensor(_data(17, 2, 8).astype(np.float16)),
           "pos.weight": tallow.tensor(_data(18, 3, 8).astype(np.float16)),
           "a.bias": tallow.tensor(_data(19, 4).astype(np.float16))}
    vb = VarBuilder(src, wasm, keep_f16=lambda name: "pos" not in name)
    assert vb.pp("a").get((4, 8), "weight").dtype is tallow.f16
    assert vb.get((4,), "a.bias").dtype is tallow.f32  # 1-D: widened as before
    assert vb.get((3, 8), "pos.weight").dtype is tallow.f32  # not named by keep_f16
    assert vb.get((4, 8), "a.weight", dtype=tallow.f32).dtype is tallow.f32  # an asked dtype wins
    joined = vb.get_rows([((4, 8), "a.weight"), ((2, 8), "b.weight")])
    assert joined.dtype is tallow.f16 and joined.shape == (6, 8)
    assert np.array_equal(joined.numpy(), np.concatenate([src["a.weight"].numpy(), src["b.weight"].numpy()]))
    assert VarBuilder(src, wasm).get((4, 8), "a.weight").dtype is tallow.f32  # no keep_f16: as before
