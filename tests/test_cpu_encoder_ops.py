"""The CPU device's encoder ops: gelu (exact GELU without scipy) and
attention (many-query attention blocked over queries), against torch."""
import math

import numpy as np
import pytest
import torch

from tallow.backends.cpu import gelu



def _wide_inputs():
    rng = np.random.default_rng(0)
    grid = np.linspace(-40, 40, 400_001)
    tiny = np.array([1e-30, -1e-30, 1e-7, -1e-7, 0.0, -0.0, 3e38, -3e38])
    return np.concatenate([grid, rng.standard_normal(100_000) * 4, tiny]).astype(np.float32)


def _kernels():
    out = [("numpy", gelu._gelu_numpy)]
    try:
        import numba  # noqa: F401  (gelu uses its kernel once the CPU kernels are in use)
    except ImportError:
        return out

    def compiled(x, out=None):
        from tallow.backends.cpu.runtime import kernel_calls
        kernel_calls.kernels()
        assert gelu._kernel() is not None
        return gelu.gelu(x, out)
    out.append(("compiled", compiled))
    return out


@pytest.mark.parametrize("name,fn", _kernels(), ids=lambda v: v if isinstance(v, str) else "")
def test_gelu_matches_torch_within_1e6_of_scale(name, fn):
    x = _wide_inputs()
    y = fn(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    ref = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    err = np.abs(y.astype(np.float64) - ref) / np.maximum(1.0, np.abs(x.astype(np.float64)))
    assert err.max() <= 1e-6, (name, float(x[err.argmax()]), float(err.max()))


@pytest.mark.parametrize("name,fn", _kernels(), ids=lambda v: v if isinstance(v, str) else "")
def test_gelu_nan_and_inf_follow_the_float64_formula(name, fn):
    x = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)
    y = fn(x)
    # 0.5 x (1 + erf(x / sqrt 2)) in float64: inf -> inf, -inf -> inf * 0 = NaN
    assert np.isnan(y[0]) and y[1] == np.inf and np.isnan(y[2]) and y[3] == 0.0


@pytest.mark.parametrize("name,fn", _kernels(), ids=lambda v: v if isinstance(v, str) else "")
def test_gelu_in_place_over_several_chunks(name, fn):
    x = np.random.default_rng(2).standard_normal((7, gelu.CHUNK // 3 + 5)).astype(np.float32) * 5
    ref = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    y = x.copy()
    assert fn(y, y) is not None
    assert np.abs(y - ref).max() <= 1e-5 * max(1.0, float(np.abs(x).max()))
    out = np.empty_like(x)
    fn(x, out)
    np.testing.assert_array_equal(out, y)


def test_gelu_into_memory_that_partly_overlaps_its_input():
    buf = np.random.default_rng(3).standard_normal(gelu.CHUNK + 9).astype(np.float32) * 4
    want = gelu.gelu(buf[:-1].copy())
    gelu.gelu(buf[:-1], out=buf[1:])  # each write lands on an input not read yet
    np.testing.assert_array_equal(buf[1:], want)


def test_gelu_uses_the_compiled_kernel_once_the_cpu_kernels_are_in_use():
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    kernel_calls.kernels()
    assert gelu._kernel() is not None


def test_gelu_gives_the_same_bits_with_and_without_numba():
    """Whether numba is loaded in a process must not change a result (a transcript): the kernel
    and the numpy passes do the same float32 operations in the same order, without fused
    multiply-adds."""
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    kernel_calls.kernels()
    x = _wide_inputs()
    kernel, in_place = gelu._kernel()
    want = gelu._gelu_numpy(x)
    got = np.empty_like(x)
    kernel(x, got)
    np.testing.assert_array_equal(got, want)
    y = x.copy()
    in_place(y)
    np.testing.assert_array_equal(y, want)


def test_gelu_alone_does_not_load_numba():
    import subprocess
    import sys
    probe = "import sys, tallow; tallow.tensor([0.5, -1.0], device='cpu').gelu().numpy(); print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gelu_keeps_shape_of_strided_input_and_leaves_other_dtypes():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] - 5
    expected = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel().tolist()]).reshape(x.shape)
    np.testing.assert_allclose(gelu.gelu(x), expected, rtol=1e-6, atol=1e-6)
    assert gelu.gelu(x.astype(np.float64)) is None


def test_gelu_through_the_tensor_api():
    import tallow
    x = np.random.default_rng(1).standard_normal((3, 50)).astype(np.float32) * 6
    y = tallow.tensor(x, device="cpu").gelu().numpy()
    np.testing.assert_allclose(y, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)


def _sdpa(q, k, v, mask=None, causal=False):
    t = [torch.from_numpy(a).double() for a in (q, k, v)]
    if k.shape[1] != q.shape[1]:  # one key/value head for all query heads
        t[1], t[2] = (a.expand(-1, q.shape[1], -1, -1) for a in t[1:])
    m = None if mask is None else torch.from_numpy(mask).double()
    if causal:  # torch's is_causal aligns the top left; tallow's the bottom right (a cache before the queries)
        tq, tk = q.shape[-2], k.shape[-2]
        m = torch.full((tq, tk), float("-inf")).triu(tk - tq + 1).double()
    return torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=m).numpy()


def _softmax_paths():
    out = ["numpy"]
    try:
        import numba  # noqa: F401
    except ImportError:
        return out
    return out + ["compiled"]


@pytest.fixture(params=_softmax_paths())
def softmax_path(request, monkeypatch):
    """attention's softmax: numpy's passes, or the compiled kernel (once the CPU kernels load)."""
    from tallow.backends.cpu import attention
    if request.param == "numpy":
        monkeypatch.setattr(attention, "_softmax_kernel", lambda: None)
    else:
        from tallow.backends.cpu.runtime import kernel_calls
        if kernel_calls.kernels() is None:
            pytest.skip("TALLOW_CPU=numpy")
        assert attention._softmax_kernel() is not None
    return request.param


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["plain", "mask", "causal", "one_kv_head", "short_last_block", "wide_heads"])
def test_blocked_attention_matches_torch(case, threads, softmax_path):
    from tallow.backends.cpu import attention
    rng = np.random.default_rng(2)
    b, h, hk, tq, tk, d = 2, 3, 3, 300, 300, 16
    if case == "one_kv_head":
        hk = 1
    if case == "short_last_block":
        tq, tk = attention.BLOCK + 5, 400
    if case == "causal":
        tq, tk = 260, 290
    if case == "wide_heads":  # heads past attention.THREAD_MIN_MACS: shared among the threads
        d = 64
        assert tq * tk * d >= attention.THREAD_MIN_MACS
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, tk, 24)).astype(np.float32)
    mask = rng.standard_normal((1, h, tq, tk)).astype(np.float32) * 3 if case == "mask" else None
    from threadpoolctl import threadpool_limits
    with threadpool_limits(threads, user_api="blas"):
        got = attention.attention(q, k, v, mask, 0.25, case == "causal")
    assert got.dtype == np.float32 and got.shape == (b, h, tq, 24)
    want = _sdpa(q * np.float32(0.25 / d ** -0.5), k, v, mask, case == "causal")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_softmax_rows_kernel_matches_numpy_and_keeps_its_nans():
    """The compiled numerator (max, exp, sum in two vector passes) against numpy's passes, on row
    lengths around the 16-lane vector, huge and tiny scores, and the rows numpy makes NaN."""
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        pytest.skip("TALLOW_CPU=numpy")
    softmax_rows = kernel_calls.decode_kernels().softmax_rows
    rng = np.random.default_rng(5)
    for n in (1, 15, 16, 17, 1500):
        s = (rng.standard_normal((6, n)) * 30).astype(np.float32)
        s[1, 0] = np.nan
        s[2] = -np.inf
        s[3, n // 2] = np.inf
        s[4, 0] = -200.0  # e^(x - max) underflows to 0
        want = s - s.max(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", over="ignore"):
            want = np.exp(want.astype(np.float64))
        totals = np.empty(6, np.float32)
        got = s.copy()
        softmax_rows(got, totals)
        for i in range(6):
            if np.isnan(want[i]).any():
                assert np.isnan(got[i]).all() and np.isnan(totals[i]), (n, i)
            else:
                np.testing.assert_allclose(got[i], want[i], rtol=3e-7, atol=2e-38)  # (0 below e^-87.3)
                assert abs(totals[i] - want[i].sum()) <= 2e-6 * want[i].sum()


def test_backend_attention_takes_the_blocked_path_for_many_queries():
    import tallow
    from tallow.backends.cpu import attention
    rng = np.random.default_rng(3)
    tq = attention.MIN_QUERIES
    q, k, v = (rng.standard_normal((1, 2, tq, 8)).astype(np.float32) for _ in range(3))
    calls = []
    real = attention.attention

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)
    attention.attention = spy
    try:
        y = tallow.functional.scaled_dot_product_attention(*(tallow.tensor(a) for a in (q, k, v))).numpy()
    finally:
        attention.attention = real
    assert calls == [(1, 2, tq, 8)]
    np.testing.assert_allclose(y, _sdpa(q, k, v), rtol=1e-5, atol=2e-6)
