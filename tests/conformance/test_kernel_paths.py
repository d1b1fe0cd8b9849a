"""Ops whose GPU kernels take their own paths, on every device: quantised weights (the
in-kernel matvec and the dequantise + matmul path), attention over KV-cache views, rows
longer than a workgroup, fused ops in f16/bf16. References: tallow.quant's numpy
dequantiser (checked bit-exact against the gguf package in test_quant.py), numpy, and
the numpy backend where the op is compared across devices."""
import numpy as np
import pytest

import tallow

from device_limits import NO_OP
from storage_io import assert_quantised_product_close

# The GGUF formats the CUDA/Metal/wgpu kernels read in place; q5_0 has no kernel (dequantised on upload).
IN_KERNEL_QUANTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


def quantised_blocks(qtype, n, k, seed=0):
    """GGUF blocks of an (n, k) weight: quantised by tallow.quant, or for Q6_K (no quantiser
    there) random blocks with a sane f16 scale."""
    from tallow.quant import quantize_numpy
    rng = np.random.default_rng(seed)
    if qtype != "q6_k":
        return quantize_numpy(rng.standard_normal((n, k)).astype(np.float32), qtype)
    blocks = rng.integers(0, 256, (n * k // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    return blocks


@pytest.mark.parametrize("qtype", IN_KERNEL_QUANTS)
@pytest.mark.parametrize("m", [1, 3, 12])  # the in-kernel matvec path, and dequantise + matmul
def test_quantised_matmul_and_rows_match_numpy(device, qtype, m):
    from tallow.quant import dequantize_numpy
    rng = np.random.default_rng(0)
    n, k = 40, 512
    blocks = quantised_blocks(qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = tallow.from_buffer(bytes(blocks), qtype, (n, k), device=device)
    got = (tallow.from_numpy(x, device=device) @ w.T).numpy()
    # A backend may quantise x per 32 values as ggml does (the CPU's numba kernels, 16 bits).
    assert_quantised_product_close(got, x, dequantize_numpy(blocks, qtype, n * k).reshape(n, k), tol=2e-3, qtype=qtype)
    rows = w.index_select(0, tallow.tensor([39, 0, 7], device=device)).numpy()
    np.testing.assert_array_equal(rows, dequantize_numpy(blocks, qtype, n * k).reshape(n, k)[[39, 0, 7]])


def test_quantised_format_without_kernel_is_dequantised_exactly(device):
    from tallow.quant import dequantize_numpy, quantize_numpy
    blocks = quantize_numpy(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32), "q5_0")
    w = tallow.from_buffer(bytes(blocks), "q5_0", (64, 32), device=device)
    np.testing.assert_array_equal(w.to(tallow.f32).numpy().reshape(-1), dequantize_numpy(blocks, "q5_0", 64 * 32))


@pytest.mark.parametrize("head_dim,cache_len,keys", [(64, 40, 30), (16, 400, 300)])  # keys longer than a block
def test_attention_reads_kv_cache_views(device, head_dim, cache_len, keys):
    """tk > tq through a narrowed cache, GQA-expanded heads and a broadcast mask, against the numpy backend."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 3, head_dim)).astype(np.float32)
    cache = rng.standard_normal((1, 2, cache_len, head_dim)).astype(np.float32)
    mask = rng.standard_normal((1, 1, 3, keys)).astype(np.float32)

    def run(dev):
        k = tallow.from_numpy(cache, device=dev).narrow(2, 0, keys)
        v = tallow.from_numpy(cache[:, :, ::-1].copy(), device=dev).narrow(2, cache_len - keys, keys)
        return tallow.scaled_dot_product_attention(tallow.from_numpy(q, device=dev), k, v, tallow.from_numpy(mask, device=dev),
                                                   is_causal=True).numpy()
    np.testing.assert_allclose(run(device), run("cpu"), rtol=1e-4, atol=1e-5)


def test_long_rows(device):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 1000)).astype(np.float32)  # rows longer than a threadgroup
    x = tallow.from_numpy(a, device=device)
    np.testing.assert_allclose(x.softmax(-1).numpy(), tallow.from_numpy(a).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5)
    assert x.argmin(1).tolist() == a.argmin(1).tolist()


def test_scatter_add_into_i64(device):
    """Metal has no 64-bit atomics: refused with the reason; everywhere else it adds like torch."""
    torch = pytest.importorskip("torch")
    ids = [[0, 1, 1], [2, 2, 2]]
    dst = tallow.zeros(2, 3, dtype=tallow.i64, device=device)
    run = lambda: dst.scatter_add(1, tallow.tensor(ids, device=device), tallow.ones(2, 3, dtype=tallow.i64, device=device))  # noqa: E731
    if (device.type, "scatter_add i64") in NO_OP:
        with pytest.raises(tallow.UnsupportedError, match="64-bit atomics"):
            run()
        return
    want = torch.zeros(2, 3, dtype=torch.int64).scatter_add(1, torch.tensor(ids), torch.ones(2, 3, dtype=torch.int64))
    assert run().tolist() == want.tolist()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_fused_ops_match_numpy_backend(device, dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 300)).astype(np.float32)
    x_cpu = tallow.from_numpy(a).to(dtype)
    x = x_cpu.to(device)
    tol = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[dtype]
    for fn in (lambda t: t.softmax(-1), lambda t: t.log_softmax(-1), lambda t: tallow.rms_norm(t, None, 1e-6),
               lambda t: t.sum(0), lambda t: t.max(1), lambda t: t.cumsum(1), lambda t: t.T.argmax(0)):
        np.testing.assert_allclose(fn(x).numpy().astype(np.float64), fn(x_cpu).numpy().astype(np.float64), rtol=tol, atol=tol)
