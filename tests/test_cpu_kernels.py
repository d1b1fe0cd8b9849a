"""The numba kernels on GGUF blocks (tallow.quant.cpu_matmul) against dequantise-then-numpy,
whose dequantisation is bit-exact with the `gguf` package (tests/test_quant.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import tallow
from tallow.dtypes import get_dtype
from tallow.errors import FormatError, ShapeError
from tallow.quant import dequantize_numpy

pytest.importorskip("numba")
import numba
from tallow.quant import cpu_matmul

FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]
SCALE_AT = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q4_k": [0, 2], "q5_k": [0, 2],
            "q6_k": [208]}


def _blocks(q, n_blocks, rng):
    """Random bytes with finite, moderate f16 scale fields (every bit of the quants exercised)."""
    d = get_dtype(q)
    raw = rng.integers(0, 256, size=(n_blocks, d.block_bytes), dtype=np.uint8)
    for at in SCALE_AT[q]:
        raw[:, at:at + 2] = rng.uniform(-2, 2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    monkeypatch.delenv("TALLOW_CPU_KERNELS", raising=False)


def _check(q, n, k, m, rng):
    raw = _blocks(q, n * k // get_dtype(q).block_size, rng)
    w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    got = cpu_matmul.qmatmul(x, raw, q, n, k)
    assert got.shape == (m, n) and got.dtype == np.float32
    # float32 sums in another order: relative to the size of the terms summed
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert np.all(np.abs(got - ref) <= 1e-5 * scale + 1e-6), q


@pytest.mark.parametrize("q", FORMATS)
def test_kernels_match_dequantised_numpy(q):
    """Odd row counts, rows of several blocks (k a multiple of the block, not of 64 or 512),
    one row (decode), a few rows (fused kernel) and many (tiled BLAS path), on 1 and 2 threads."""
    rng = np.random.default_rng(FORMATS.index(q))
    bs = get_dtype(q).block_size
    for threads in (1, 2):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        try:
            for n, k, m in ((1, bs, 1), (37, 3 * bs, 1), (21, 5 * bs, 3), (19, 3 * bs, cpu_matmul.FUSED_MAX_ROWS + 5)):
                _check(q, n, k, m, rng)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_tiled_path_covers_ragged_last_tile(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "TILE_ELEMENTS", 64 * 3)  # 3 rows a tile, 10 rows: a ragged last tile
    _check("q8_0", 10, 64, 20, np.random.default_rng(5))


@pytest.mark.parametrize("q", FORMATS)
def test_embedding_rows_are_bit_exact(q):
    rng = np.random.default_rng(7)
    k, n = 2 * get_dtype(q).block_size, 9
    raw = _blocks(q, n * 2, rng)
    full = dequantize_numpy(raw, q, n * k).reshape(n, k)
    ids = np.array([3, 0, 8, 3])
    got = cpu_matmul.dequant_rows(raw, q, k, ids)
    assert np.array_equal(got.view(np.uint32), full[ids].view(np.uint32))
    with pytest.raises(FormatError, match="out of range"):
        cpu_matmul.dequant_rows(raw, q, k, [n])


def test_f16_matmul():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((13, 70)).astype(np.float16)
    x = rng.standard_normal((2, 70)).astype(np.float32)
    np.testing.assert_allclose(cpu_matmul.f16_matmul(x, w.view(np.uint16)), x @ w.astype(np.float32).T,
                               rtol=1e-5, atol=1e-5)


def test_bad_shapes_raise_tallow_errors():
    raw = _blocks("q4_0", 4, np.random.default_rng(0))
    with pytest.raises(ShapeError, match="multiple of the block size"):
        cpu_matmul.qmatmul(np.zeros((1, 48), np.float32), raw[:18 * 3], "q4_0", 2, 48)
    with pytest.raises(ShapeError, match="last dim 64"):
        cpu_matmul.qmatmul(np.zeros((1, 32), np.float32), raw, "q4_0", 2, 64)
    with pytest.raises(FormatError, match="need 72 bytes"):
        cpu_matmul.qmatmul(np.zeros((1, 64), np.float32), raw[:-1], "q4_0", 2, 64)


def test_backend_keeps_f32_copies_within_the_budget_and_uses_kernels_past_it(monkeypatch):
    from tallow.backends import numpy_backend
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    wq = tallow.from_numpy(w).to(get_dtype("q4_0"))
    deq = wq.to(tallow.f32).numpy()
    used = numpy_backend._DEQUANT_CACHE.used
    monkeypatch.setenv("TALLOW_QUANT_CACHE_MB", "0")  # no budget: the kernels read the blocks
    np.testing.assert_allclose((tallow.from_numpy(x) @ wq.T).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)
    assert numpy_backend._DEQUANT_CACHE.used == used  # nothing was cached
    ids = tallow.from_numpy(np.array([5, 0], dtype=np.int64))
    np.testing.assert_array_equal(wq.index_select(0, ids).numpy(), deq[[5, 0]])  # an embedding lookup
    monkeypatch.delenv("TALLOW_QUANT_CACHE_MB")  # the default budget: an f32 copy (faster decode)
    np.testing.assert_allclose((tallow.from_numpy(x) @ wq.T).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)
    assert numpy_backend._DEQUANT_CACHE.used == used + w.size * 4
    monkeypatch.setenv("TALLOW_CPU_KERNELS", "0")  # the numpy path is still there
    assert not cpu_matmul.supports("q4_0")
    np.testing.assert_allclose((tallow.from_numpy(x) @ wq.T).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("TALLOW_QUANT_CACHE_MB", "lots")
    with pytest.raises(tallow.Error, match="TALLOW_QUANT_CACHE_MB='lots'"):
        tallow.from_numpy(x) @ tallow.from_numpy(w).to(get_dtype("q4_0")).T


def test_import_tallow_does_not_import_numba():
    code = "import sys, tallow; tallow.zeros(2); print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), check=True)
    assert out.stdout.strip() == "False"


def test_kernels_run_as_plain_python():
    """NUMBA_DISABLE_JIT=1: the same kernel source runs as Python on small shapes (so it stays readable)."""
    code = (
        "import numpy as np, sys; sys.path[:0] = [sys.argv[1]]\n"
        "from test_cpu_kernels import _check, FORMATS\n"
        "from tallow.quant import cpu_matmul\n"
        "rng = np.random.default_rng(0)\n"
        "for q in FORMATS:\n"
        "    bs = 256 if q.endswith('_k') else 32\n"
        "    _check(q, 3, bs, 1, rng); _check(q, 2, bs, cpu_matmul.FUSED_MAX_ROWS + 1, rng)\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
