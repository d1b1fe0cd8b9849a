"""The CUDA and Metal kernel backend's fused decode ops (tallow/backends/kernel/backend.py,
core/backends/gpu_kernels/) are one launch each on the CPU emulators -- the kernels, not
base.py's compositions -- and the quantised gated matvec reads the super-block formats (Q4_K,
Q6_K) as gguf dequantises them. tests/conformance/test_fused.py checks the results of the
others on every device."""
import numpy as np
import pytest

import tallow
from tallow import functional as F
from tallow.device import restore_backend, use_backend

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)


@pytest.fixture(params=["cuda-emulator", "metal-emulator"])
def emulator(request):
    """(device, driver) of a kernel backend on its CPU emulator (the driver counts launches)."""
    from conftest import DEVICES, emulated
    backend = emulated(request.param)
    name = DEVICES[request.param][0]
    try:
        yield use_backend(name, backend), backend.driver
    finally:
        restore_backend(name)


def _launches(driver, op):
    """(op's result, launches it made)."""
    before = driver.launches
    out = op()
    return out, driver.launches - before


def _t(a, dev):
    return tallow.from_numpy(np.ascontiguousarray(a, np.float32), device=dev)


def test_fused_decode_ops_are_one_launch_each(emulator):
    dev, driver = emulator
    x, r, w, b = (_t(RNG.standard_normal(s), dev) for s in ((1, 1, 64), (1, 1, 64), (64,), (64,)))
    ops = {
        "add_rms_norm": lambda: F.add_rms_norm(x, r, w, 1e-5),
        "add_layer_norm": lambda: F.add_layer_norm(x, r, w, b, 1e-5),
        "linear with bias": lambda: F.linear(x, _t(RNG.standard_normal((16, 64)), dev), b.narrow(0, 0, 16)),
        "gated_linear": lambda: F.gated_linear(x, _t(RNG.standard_normal((32, 64)), dev), "silu"),
    }
    q, k, v = (_t(RNG.standard_normal((1, h, 1, 8)), dev) for h in (4, 2, 2))
    cos, sin = _t(RNG.standard_normal((1, 4)), dev), _t(RNG.standard_normal((1, 4)), dev)
    kc, vc = tallow.zeros(1, 2, 6, 8, device=dev), tallow.zeros(1, 2, 6, 8, device=dev)
    ops["rope_kv_write"] = lambda: F.rope_kv_write(q, k, v, cos, sin, kc.narrow(2, 3, 1), vc.narrow(2, 3, 1))
    ops["kv_write"] = lambda: F.kv_write(k, v, kc.narrow(2, 4, 1), vc.narrow(2, 4, 1))
    counts = {name: _launches(driver, op)[1] for name, op in ops.items()}
    assert counts == {name: 1 for name in ops}, counts


# Where each format keeps its f16 scales (random bytes there could be inf or NaN).
SCALE_AT = {"q4_k": [0, 2], "q6_k": [208], "q8_0": [0]}


def _random_blocks(qtype, rows, k):
    """Random bytes for rows of k elements with moderate f16 scale fields: every bit of the quants exercised."""
    d = tallow.get_dtype(qtype)
    count = rows * k // d.block_size
    raw = RNG.integers(0, 256, size=(count, d.block_bytes), dtype=np.uint8)
    for at in SCALE_AT[qtype]:
        raw[:, at:at + 2] = RNG.uniform(-0.1, 0.1, size=count).astype(np.float16).view(np.uint8).reshape(count, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", ["q4_k", "q6_k", "q8_0"])
def test_gated_quantised_matvec_is_one_launch_and_reads_the_blocks(emulator, qtype):
    dev, driver = emulator
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    n, k = 6, 256
    x = RNG.standard_normal((2, k)).astype(np.float32)
    blocks = _random_blocks(qtype, 2 * n, k)
    ref_w = gguf.quants.dequantize(blocks, kind).reshape(2 * n, k)
    wq = tallow.from_buffer(blocks.tobytes(), qtype, (2 * n, k), device=dev)
    xt = _t(x, dev)
    got, launches = _launches(driver, lambda: F.gated_linear(xt, wq, "silu"))
    assert launches == 1
    y = torch.from_numpy(x.astype(np.float64)) @ torch.from_numpy(ref_w.astype(np.float64)).T
    want = (torch.nn.functional.silu(y[:, :n]) * y[:, n:]).numpy()
    # f32 dot products of 256 terms against the float64 reference of the same dequantised weights:
    # each product's rounding error scales with its terms' magnitudes (random scale bytes make
    # terms of 1e4 that cancel to 30), carried through silu(a) * b (silu' <= 1.1)
    dot_err = _dot_error(x, ref_w)
    b = y[:, n:].numpy()
    bound = 1.1 * np.abs(b) * dot_err[:, :n] + np.abs(want / np.where(b == 0, 1, b)) * dot_err[:, n:]
    assert np.all(np.abs(got.numpy() - want) <= bound + 1e-4 * np.abs(want) + 1e-3), (got.numpy(), want)


@pytest.mark.parametrize("qtype", ["q4_k", "q8_0"])
def test_biased_quantised_matvec_is_one_launch(emulator, qtype):
    """qmatmul_bias (a Linear with a quantised weight and a bias: Whisper's) is the quantised matvec
    adding the bias itself, not a matvec and an add."""
    dev, driver = emulator
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    n, k = 6, 256
    x, bias = RNG.standard_normal((2, k)).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    blocks = _random_blocks(qtype, n, k)
    ref_w = gguf.quants.dequantize(blocks, kind).reshape(n, k)
    wq = tallow.from_buffer(blocks.tobytes(), qtype, (n, k), device=dev)
    xt, bt = _t(x, dev), _t(bias, dev)
    got, launches = _launches(driver, lambda: F.linear(xt, wq, bt))
    assert launches == 1
    want = x.astype(np.float64) @ ref_w.astype(np.float64).T + bias
    bound = _dot_error(x, ref_w) + 1e-4 * np.abs(want) + 1e-3
    assert np.all(np.abs(got.numpy() - want) <= bound), (got.numpy(), want)


def _dot_error(x, w):
    """A bound on f32 dot products' rounding error, row by row: k units of f32 rounding times the
    sum of the terms' magnitudes."""
    return x.shape[-1] * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)
