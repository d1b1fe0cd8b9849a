"""The CPU device's encoder ops: cpu_gelu (exact GELU without scipy) and
cpu_attention (many-query attention blocked over queries), against torch."""
import math

import numpy as np
import pytest
import torch

from tallow.backends import cpu_gelu



def _wide_inputs():
    rng = np.random.default_rng(0)
    grid = np.linspace(-40, 40, 400_001)
    tiny = np.array([1e-30, -1e-30, 1e-7, -1e-7, 0.0, -0.0, 3e38, -3e38])
    return np.concatenate([grid, rng.standard_normal(100_000) * 4, tiny]).astype(np.float32)


def _kernels():
    out = [("numpy", cpu_gelu._gelu_numpy)]
    if cpu_gelu._kernel() is not None:
        out.append(("numba", cpu_gelu.gelu))
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


def test_gelu_keeps_shape_of_strided_input_and_leaves_other_dtypes():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] - 5
    expected = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel().tolist()]).reshape(x.shape)
    np.testing.assert_allclose(cpu_gelu.gelu(x), expected, rtol=1e-6, atol=1e-6)
    assert cpu_gelu.gelu(x.astype(np.float64)) is None


def test_gelu_through_the_tensor_api():
    import tallow
    x = np.random.default_rng(1).standard_normal((3, 50)).astype(np.float32) * 6
    y = tallow.tensor(x, device="cpu").gelu().numpy()
    np.testing.assert_allclose(y, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)
