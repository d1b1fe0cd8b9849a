"""The wasm device (core/backends/wasm/backend.py): tallow.Device("wasm") is WasmBackend over
kernels.wasm under wasmtime. Its kernel table against numpy, capture and replay as one `run` call,
the replayed step's token check, and the refusals that name the device and the op. The
conformance suite runs on it too (tests/conformance/wasm_limits.py lists what it skips)."""
import subprocess
import sys

import numpy as np
import pytest

import tallow
import tallow.functional as F

pytest.importorskip("wasmtime", reason="the wasm device runs natively under wasmtime: pip install wasmtime")
from tallow.backends.wasm import build  # noqa: E402

if not __import__("os").path.exists(build.SHIPPED):
    pytest.skip("kernels.wasm is not built here: make wasm", allow_module_level=True)


@pytest.fixture(scope="module")
def wasm():
    return tallow.Device("wasm")


def test_the_device_is_the_wasm_backend_over_wasmtime(wasm):
    from tallow.backends.wasm.backend import WasmBackend
    from tallow.backends.wasm.driver_native import WasmtimeDriver
    assert isinstance(wasm.backend, WasmBackend) and isinstance(wasm.backend.driver, WasmtimeDriver)
    assert wasm.backend.can_capture() and "wasm" in tallow.device.devices()
    assert tallow.tensor([1.5, -2.0], device="wasm").tolist() == [1.5, -2.0]


def test_without_wasmtime_the_device_says_what_to_install():
    """In a child process whose wasmtime import fails: a DeviceError naming `pip install wasmtime`."""
    code = ("import sys; sys.modules['wasmtime'] = None\n"
            "import tallow\n"
            "try:\n    tallow.Device('wasm')\nexcept tallow.DeviceError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR" in out.stdout and "pip install wasmtime" in out.stdout, out.stdout + out.stderr


def test_argmax_takes_the_first_largest_and_nans_as_numpy(wasm):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 1001)).astype(np.float32)
    x[1, [7, 9]] = np.nan           # the first NaN
    x[2, [3, 800]] = 50.0           # a tie: the first
    x[3, :] = -np.inf               # all -inf: index 0
    x[4, 1000] = np.inf             # the last one
    got = tallow.from_numpy(x, device=wasm).argmax(-1).tolist()
    assert got == np.argmax(x, -1).tolist()
    assert tallow.from_numpy(x[0], device=wasm).argmax().item() == int(np.argmax(x[0]))


def test_copies_are_bit_exact_for_every_dtype(wasm):
    """copy_f32 moves words: i64 whose halves read as float NaNs, f16 pairs, a row-strided view."""
    bits = np.array([0x7FC00001FFFFFFFF, -1, 0x7F80000100000000, 3], dtype=np.int64)
    t = tallow.from_numpy(bits, device=wasm)
    np.testing.assert_array_equal(t.contiguous().numpy(), bits)
    np.testing.assert_array_equal(t[1:3].contiguous().numpy(), bits[1:3])
    h = np.arange(24, dtype=np.float16).reshape(4, 6)
    np.testing.assert_array_equal(tallow.from_numpy(h, device=wasm)[1:3, 2:6].contiguous().numpy(), h[1:3, 2:6])
    x = np.random.default_rng(1).standard_normal((3, 4, 8)).astype(np.float32)
    view = tallow.from_numpy(x, device=wasm).permute(1, 0, 2)  # rows of 8 stay contiguous
    np.testing.assert_array_equal(view.contiguous().numpy(), x.transpose(1, 0, 2))


def test_norms_and_activations_match_numpy(wasm):
    rng = np.random.default_rng(2)
    x, r = rng.standard_normal((5, 70)).astype(np.float32), rng.standard_normal((5, 70)).astype(np.float32)
    w, b = rng.standard_normal(70).astype(np.float32), rng.standard_normal(70).astype(np.float32)
    T = lambda a: tallow.from_numpy(a, device=wasm)  # noqa: E731
    total = x + r
    rms = total / np.sqrt((total * total).mean(-1, keepdims=True) + 1e-6) * w
    h, y = F.add_rms_norm(T(x), T(r), T(w), 1e-6)
    np.testing.assert_allclose(h.numpy(), total, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), rms, rtol=1e-4, atol=1e-5)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(F.layer_norm(T(x), T(w), T(b), 1e-5).numpy(), ln, rtol=1e-4, atol=1e-5)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(F.softmax(T(x), -1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(F.silu(T(x)).numpy(), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def _step(dev, table, kc, vc, position, ids):
    """A decode-shaped step: the token's embedding row (q8_0 blocks), then attention over a cache."""
    h = F.embedding(ids, table)                              # (1, 1, 64)
    q = h.reshape(1, 2, 1, 32)
    k = h.reshape(1, 2, 1, 32).narrow(1, 0, 1)
    v = h.reshape(1, 2, 1, 32).narrow(1, 1, 1)
    return F.cache_attention(q, k, v, kc, vc, position, scale=0.25)


def test_a_captured_step_replays_as_one_run_call_at_any_position_and_token(wasm):
    from tallow.quant import quantize_numpy
    rng = np.random.default_rng(3)
    blocks = quantize_numpy(rng.standard_normal((50, 64)).astype(np.float32), "q8_0")
    results = {}
    for dev in ("cpu", wasm):
        table = tallow.from_buffer(bytes(blocks), "q8_0", (50, 64), device=dev)
        kc, vc = tallow.zeros((1, 1, 16, 32), device=dev), tallow.zeros((1, 1, 16, 32), device=dev)
        outs = [_step(dev, table, kc, vc, 0, tallow.tensor([[5]], tallow.i64, dev)).numpy()]
        if dev is wasm:
            backend = wasm.backend
            with tallow.capture(wasm, position=1) as graph:
                ids = graph.input([[17]], tallow.i64)
                graph.output(_step(dev, table, kc, vc, 1, ids))
            outs.append(graph.results()[0].numpy())
            calls = []

            def counting(export, args, original=backend.driver._call, calls=calls):
                calls.append(export)
                return original(export, args)
            backend.driver._call = counting
            try:
                for position, token in ((2, 3), (3, 49), (4, 0)):
                    outs.append(graph.replay([[token]], position=position)[0].numpy())
            finally:
                del backend.driver._call
            assert calls.count("run") == 3 and backend.replays >= 3  # one `run` per replay (+ the output copies)
            with pytest.raises(tallow.IndexRangeError, match="token id 50"):
                graph.replay([[50]], position=5)
        else:
            for position, token in ((1, 17), (2, 3), (3, 49), (4, 0)):
                outs.append(_step(dev, table, kc, vc, position, tallow.tensor([[token]], tallow.i64, dev)).numpy())
        results[str(dev)] = outs
    for got, want in zip(results["wasm"], results["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ops_without_a_wasm_kernel_name_the_device_and_the_op(wasm):
    a = tallow.from_numpy(np.ones((3, 4), np.float32), device=wasm)
    with pytest.raises(tallow.UnsupportedError, match=r"wasm device has no kernel for unary log"):
        a.log()
    with pytest.raises(tallow.UnsupportedError, match=r"wasm device has no kernel for compare lt"):
        _ = a < a
    with pytest.raises(tallow.UnsupportedError, match=r"wasm device has no kernel for cumsum"):
        a.cumsum(1)
    with pytest.raises(tallow.UnsupportedError, match=r"wasm device computes .* in f32 only, not f16"):
        F.softmax(tallow.from_numpy(np.ones(4, np.float16), device=wasm), -1)


def test_the_strided_kernels_op_tables_are_the_devices():
    """backend.py's op lists and constants (stdlib only: it imports in Pyodide) equal the kernels' own."""
    from tallow.backends.wasm import backend, elementwise_ir, gemm_ir
    from tallow.backends.kernel.host import BINARY_CODES, REDUCE_CODES, UNARY_CODES
    assert {n: UNARY_CODES[n] for n in backend.WASM_UNARY} == elementwise_ir.UNARY_OPS
    assert {n: BINARY_CODES[n] for n in backend.WASM_BINARY} == elementwise_ir.BINARY_OPS
    assert {n: REDUCE_CODES[n] for n in backend.WASM_REDUCE} == {n: c for n, c in elementwise_ir.REDUCE_OPS.items()
                                                                if n != "mean"}
    assert backend.META_DIMS == elementwise_ir.MAX_DIMS and gemm_ir.scratch_floats(10) == backend.GEMM_NR * 10


def test_products_views_reductions_attention_and_conv1d_match_numpy(wasm):
    import torch
    rng = np.random.default_rng(4)
    T = lambda a: tallow.from_numpy(np.ascontiguousarray(a), device=wasm)  # noqa: E731
    a, b = rng.standard_normal((2, 3, 7, 33)).astype(np.float32), rng.standard_normal((2, 3, 33, 9)).astype(np.float32)
    np.testing.assert_allclose((T(a) @ T(b)).numpy(), a @ b, rtol=1e-4, atol=1e-5)
    w = rng.standard_normal((9, 33)).astype(np.float32)  # a Linear's weight, read transposed as it lies
    np.testing.assert_allclose((T(a[0, 0]) @ T(w).T).numpy(), a[0, 0] @ w.T, rtol=1e-4, atol=1e-5)
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    view = T(x).permute(2, 0, 1)  # a transposed last dim: the strided kernels
    np.testing.assert_array_equal(view.contiguous().numpy(), x.transpose(2, 0, 1))
    np.testing.assert_allclose(view.sum(-1).numpy(), x.transpose(2, 0, 1).sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(T(x).max(1).numpy(), x.max(1))
    np.testing.assert_allclose((T(x) * T(x[:, :1, :])).numpy(), x * x[:, :1, :], rtol=1e-6)
    np.testing.assert_array_equal(T(x).to(tallow.f16).numpy(), x.astype(np.float16))
    q, k, v = (rng.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (5, 7, 7))
    mask = rng.standard_normal((1, 1, 5, 7)).astype(np.float32)
    for causal, m in ((False, None), (True, None), (False, mask)):
        got = F.scaled_dot_product_attention(T(q), T(k), T(v), None if m is None else T(m), is_causal=causal).numpy()
        if causal:  # tallow's causal mask is bottom-right aligned (key j > i + tk - tq), torch's top-left
            m = np.where(np.arange(7)[None, :] > np.arange(5)[:, None] + 2, -np.inf, 0).astype(np.float32)
        want = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(t) for t in (q, k, v)), attn_mask=None if m is None else torch.from_numpy(m)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    sig, cw = rng.standard_normal((2, 3, 20)).astype(np.float32), rng.standard_normal((4, 3, 3)).astype(np.float32)
    for stride in (1, 2):
        want = torch.nn.functional.conv1d(torch.from_numpy(sig), torch.from_numpy(cw), stride=stride, padding=1)
        np.testing.assert_allclose(F.conv1d(T(sig), T(cw), stride=stride, padding=1).numpy(), want.numpy(),
                                   rtol=1e-4, atol=1e-5)
    table = rng.standard_normal((11, 6)).astype(np.float32)
    np.testing.assert_array_equal(F.embedding(tallow.tensor([3, 0, 10], device=wasm), T(table)).numpy(),
                                  table[[3, 0, 10]])
    cube = rng.standard_normal((2, 9, 5)).astype(np.float32)
    for ids in (tallow.tensor([8, 1], tallow.i32, wasm), tallow.tensor([4], device=wasm)):  # read in place
        want = cube[:, ids.tolist(), :]
        np.testing.assert_array_equal(T(cube).index_select(1, ids).numpy(), want)
        np.testing.assert_array_equal(T(cube).permute(1, 0, 2).index_select(0, ids).numpy(),
                                      cube.transpose(1, 0, 2)[ids.tolist()])
