"""The CPU device's gated activations over a prompt's [gate | up] product (fused_ops.gate_rows:
SiLU, GELU in its erf and tanh forms, ReLU, in one pass) against torch, and the backend taking that path."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _kernels():
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        pytest.skip("TALLOW_CPU=numpy")
    return kernel_calls.decode_kernels()


def _want(y, n, act):
    t = torch.from_numpy(y.astype(np.float64))
    g = {"silu": torch.nn.functional.silu, "relu": torch.relu}.get(act) or (
        lambda v: torch.nn.functional.gelu(v, approximate="tanh" if act == "gelu_tanh" else "none"))
    return (g(t[:, :n]) * t[:, n:]).numpy()


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 2048])
def test_gate_rows_matches_torch(act, n):
    from tallow.backends.cpu.kernels.codes import ACT_CODES
    dec = _kernels()
    rng = np.random.default_rng(n)
    y = (rng.standard_normal((7, 2 * n)) * 4).astype(np.float32)
    y[0, :min(n, 6)] = [0.0, -0.0, 1e-30, -60.0, 60.0, 7.9][:min(n, 6)]  # zero, tiny, past the tanh clamp
    out = np.empty((7, n), np.float32)
    dec.gate_rows(y, ACT_CODES[act], out)
    want = _want(y, n, act)
    # a few float32 ulps of each factor (the rational tanh: within 3.4e-7 of float64's; SiLU's
    # tanh form: up to ~3e-6 absolute where the gate is very negative)
    atol = (4e-6 if act == "silu" else 2e-6) * np.abs(y[:, n:]).max()
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=atol)


def test_gate_rows_keeps_nan_and_infinities_as_the_formula():
    from tallow.backends.cpu.kernels.codes import ACT_CODES
    dec = _kernels()
    y = np.array([[np.nan, np.inf, -np.inf, 1.0, 1.0, 1.0]], np.float32)
    out = np.empty((1, 3), np.float32)
    dec.gate_rows(y, ACT_CODES["gelu_tanh"], out)
    with np.errstate(invalid="ignore"):
        x = y[0, :3]
        want = 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))
    np.testing.assert_array_equal(out[0], want)  # NaN, +inf, -inf * 0 = NaN


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu"])
def test_prompt_gated_linear_on_the_cpu_matches_torch(act, monkeypatch):
    """A prompt's gated float product (rows past the decode kernels') through the backend's gate,
    which takes gate_rows (spied)."""
    import tallow
    from tallow.backends.cpu.kernels.codes import ACT_CODES
    dec = _kernels()
    calls = []
    real = dec.gate_rows
    monkeypatch.setattr(dec, "gate_rows", lambda *a: (calls.append(a[1]), real(*a))[1])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 40)).astype(np.float32)
    w = (rng.standard_normal((2 * 33, 40)) * 0.3).astype(np.float32)
    got = tallow.functional.gated_linear(tallow.tensor(x), tallow.tensor(w), act).numpy()
    y = x.astype(np.float64) @ w.T.astype(np.float64)
    want = _want(y, 33, act)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert calls == [ACT_CODES[act]]
