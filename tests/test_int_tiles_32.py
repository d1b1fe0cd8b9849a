"""The q4_0 / q5_0 / q8_0 prompt tiles (core/backends/cpu/kernels/int_tiles_32.py): the activation
quantiser against int_tiles.quantize_i8 (itself tested against gguf's rounding) and the lane layout,
the weight unpacking against gguf-py's dequantiser, the tiles against int8 activations times the
dequantised weights (every lane-group shape: rows of 1-45 blocks, weight and activation rows past the
last whole tile, 1 and 2 threads), the integer extremes, the generic IR (arm64 / wasm), plain Python
(NUMBA_DISABLE_JIT=1, a child process), and a prompt's logits against the dequantise-then-BLAS path."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from tallow.dtypes import get_dtype  # noqa: E402
from tallow.quant import dequantize_numpy  # noqa: E402
from tallow.backends.cpu.runtime import kernel_calls  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from random_blocks import random_blocks  # noqa: E402

FORMATS = ("q4_0", "q5_0", "q8_0")
CODE = {"q4_0": 0, "q5_0": 2, "q8_0": 4}
# k / 32 blocks: 1-3 (padded to 4), 4, 8, 12 (padded to 16), 16 + 4 (Gemma-3-270M's 640), 16 + 8, 28 (Qwen2.5-0.5B's
# 896: padded to 32), 45 (to 48)
BLOCKS = (1, 3, 4, 8, 12, 20, 24, 28, 45)


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    for name in ("TALLOW_CPU", "TALLOW_CPU_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    if kernel_calls.kernels() is None:
        pytest.skip("CPU kernels unavailable")
    monkeypatch.setattr(kernel_calls, "TILE_32_MAX_ROWS", 128)
    yield
    monkeypatch.undo()
    kernel_calls.set_threads(kernel_calls.thread_count())


def _t32():
    from tallow.backends.cpu.kernels import int_tiles_32
    return int_tiles_32


def _packed(x, fmt):
    t32 = _t32()
    m, k = x.shape
    nbp = t32.padded_blocks(k)
    xp, dx, st = np.empty((m, 32 * nbp), np.uint8), np.empty((m, nbp), np.float32), np.empty((m, nbp), np.int32)
    kernel_calls._state["tiles_32"].quantize_32(x, fmt, xp, dx, st)
    return xp, dx, st


def _int8(x):
    m, k = x.shape
    qx, dx = np.empty((m, k), np.uint8), np.empty((m, k // 32), np.float32)
    s32, s16 = np.empty((m, k // 32), np.int32), np.empty((m, k // 16), np.int32)
    kernel_calls._state["tiles"].quantize_i8(x, 32, qx, dx, s32, s16)
    return qx.view(np.int8), dx, s32


@pytest.mark.parametrize("blocks", BLOCKS)
def test_activations_are_quantize_i8s_in_lanes(blocks):
    """quantize_32's values and scales are quantize_i8's (group 32: gguf's rounding, ties included), in
    the lane layout; the starts are -offset x the 32-value sums; padding blocks all zero."""
    t32 = _t32()
    rng = np.random.default_rng(blocks)
    k = 32 * blocks
    x = rng.standard_normal((3, k)).astype(np.float32) * np.float32(3)
    x[0, :32] = 0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5
    qx, dx8, s32 = _int8(x)
    for q, fmt in CODE.items():
        xp, dx, st = _packed(x, fmt)
        nbp = t32.padded_blocks(k)
        plain = t32.layout_rows(xp, nbp).view(np.int8)
        assert np.array_equal(plain[:, :k], qx) and not plain[:, k:].any(), q
        assert np.array_equal(dx[:, :blocks], dx8) and not dx[:, blocks:].any()
        assert np.array_equal(st[:, :blocks], -t32.OFFSET[fmt] * s32) and not st[:, blocks:].any()


def test_lane_layout():
    """Group of L blocks from block g: vector j (4L bytes) holds values 4j...4j + 3 of block g + l at bytes
    4l...4l + 3 (written out here for rows of 16 + 4, 16 + 8 and 32 blocks); rows padded as said."""
    t32 = _t32()
    assert [t32.padded_blocks(32 * b) for b in (1, 4, 5, 8, 12, 20, 24, 28, 29, 45)] == \
        [4, 4, 8, 8, 16, 20, 24, 32, 32, 48]
    for nbp, groups in ((20, ((0, 16), (16, 4))), (24, ((0, 16), (16, 8))), (32, ((0, 16), (16, 16)))):
        values = np.arange(nbp * 32).reshape(nbp, 32)  # block b's value v is 32 b + v
        packed = np.empty(nbp * 32, np.int64)
        at = 0
        for g, lanes in groups:
            for j in range(8):
                for lane in range(lanes):
                    packed[at:at + 4] = values[g + lane, 4 * j:4 * j + 4]
                    at += 4
        assert np.array_equal(t32.layout_rows(packed, nbp), values.reshape(-1))


@pytest.mark.parametrize("q", FORMATS)
def test_weights_unpack_to_ggufs_values(q):
    """pack_rows' unsigned bytes minus the format's offset, times the scales, are gguf-py's dequantised
    rows (q5_0's fifth bits, q8_0's sign included); padding zero."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    t32 = _t32()
    rng = np.random.default_rng(2)
    d = get_dtype(q)
    for blocks in (3, 28):
        n, k = 5, 32 * blocks
        raw = random_blocks(q, n * blocks, rng)
        nbp = t32.padded_blocks(k)
        wp, ws = np.full(n * nbp * 32, 7, np.uint8), np.full(n * nbp, np.nan, np.float32)
        from tallow.backends.cpu.kernels import codes
        t32.pack_rows(CODE[q], d.block_bytes, raw, 0, n, blocks, codes.F16_TABLE, wp, ws)
        u = t32.layout_rows(wp.reshape(n, -1), nbp).reshape(n, nbp, 32).astype(np.float64)
        got = ((u - t32.OFFSET[CODE[q]]) * ws.reshape(n, nbp, 1))[:, :blocks].reshape(n, k)
        want = dequantize(raw.reshape(n, -1), getattr(GGMLQuantizationType, q.upper())).reshape(n, k)
        assert np.array_equal(got, want.astype(np.float64)), q
        assert not u[:, blocks:].any() and not ws.reshape(n, nbp)[:, blocks:].any()


def _check(q, n, k, m, rng, raw=None, x=None):
    """qmatmul of m rows (the tiles) against the int8 activations times the dequantised weights (float32
    rounding only) and against the float activations (within the 8-bit step's bound)."""
    d = get_dtype(q)
    raw = random_blocks(q, n * k // d.block_size, rng) if raw is None else raw
    w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32) if x is None else x
    got = kernel_calls.qmatmul(x, raw, q, n, k)
    assert got.shape == (m, n) and got.dtype == np.float32
    qx, dx, _ = _int8(x)
    xq = (qx.astype(np.float64).reshape(m, -1, 32) * dx.astype(np.float64)[..., None]).reshape(m, k)
    scale = np.abs(xq) @ np.abs(w).T
    assert np.all(np.abs(got - xq @ w.T) <= 2e-6 * scale + 1e-6), q
    bound = (np.abs(w).reshape(n, k // 32, 32).sum(axis=2) @ (dx.astype(np.float64) / 2).T).T
    assert np.all(np.abs(got - x.astype(np.float64) @ w.T) <= bound + 2e-6 * scale + 1e-6), q


@pytest.mark.parametrize("q", FORMATS)
def test_tiles_match_dequantised_numpy(q):
    t32 = _t32()
    tw, tx = t32.TILE
    rng = np.random.default_rng(CODE[q])
    m0 = kernel_calls.FUSED_MAX_ROWS + 1
    for threads in (1, 2):
        kernel_calls.set_threads(threads)
        for blocks in BLOCKS:
            for n, m in ((1, m0), (tw + 1, m0 + tx + 1), (t32.CHUNK_ROWS + tw + 3, 64), (37, m0 + 3 * tx + 2)):
                assert kernel_calls.FUSED_MAX_ROWS < m <= kernel_calls.TILE_32_MAX_ROWS
                _check(q, n, 32 * blocks, m, rng)


@pytest.mark.parametrize("q", FORMATS)
def test_tiles_at_their_integer_bounds(q):
    """Every quant its largest and smallest (q4_0 -8 / 7, q5_0 -16 / 15, q8_0 -128 / 127: w + 128 = 0 and
    255 unsigned), activations all +-127 (constant rows, alternating signs by value and by block): the
    int32 lanes of 32 products of up to 255 x 128 and the starts exact."""
    d = get_dtype(q)
    rng = np.random.default_rng(7)
    n, k, m = 6, 32 * 20, kernel_calls.FUSED_MAX_ROWS + 5
    raw = random_blocks(q, n * k // 32, rng).reshape(n * k // 32, d.block_bytes)
    body = raw[:, 2:]
    body[:n * k // 64] = 255 if q != "q8_0" else 127  # largest (q4_0 nibbles 15, q5_0 also high bits set)
    body[n * k // 64:] = 0 if q != "q8_0" else 128  # smallest (q8_0: -128)
    x = np.ones((m, k), np.float32)
    x[1::2] = -1
    x[2] = np.where(np.arange(k) % 2 == 0, 1, -1)
    x[3] = np.where((np.arange(k) // 32) % 2 == 0, 1, -1)
    _check(q, n, k, m, rng, raw=raw.reshape(-1), x=x)


def test_generic_ir_form(monkeypatch):
    """The tile compiled as arm64 / wasm get it (the byte products widened to 32 bits in generic IR,
    chosen at compile time) against the VNNI form's products (both exact integers, float32 sums)."""
    from numba import njit
    from tallow.backends.cpu.kernels import codes
    t32 = _t32()
    monkeypatch.setattr(t32, "_VNNI", False)
    tw, tx = t32.TILE
    tile = t32._make_tile(tw, tx)

    @njit
    def run(fmt, bb, raw, xp, dx, st, table, out, n):
        nbp = dx.shape[1]
        nb = raw.size // (n * bb)
        wp = np.empty(n * nbp * 32, np.uint8)
        ws = np.empty(n * nbp, np.float32)
        t32.pack_rows(fmt, bb, raw, 0, n, nb, table, wp, ws)
        for w in range(0, n, tw):
            for i in range(0, dx.shape[0], tx):
                tile(wp, ws, w, min(tw, n - w), 0, xp, dx, st, out, i)
    rng = np.random.default_rng(4)
    for q in FORMATS:
        d = get_dtype(q)
        n, k, m = 2 * tw + 1, 32 * 28, kernel_calls.FUSED_MAX_ROWS + tx - 1  # (qmatmul: the tiles)
        raw = random_blocks(q, n * k // 32, rng)
        x = rng.standard_normal((m, k)).astype(np.float32)
        xp, dx, st = _packed(x, CODE[q])
        got = np.full((m, n), np.nan, np.float32)
        run(CODE[q], d.block_bytes, raw, xp, dx, st, codes.F16_TABLE, got, n)
        want = kernel_calls.qmatmul(x, raw, q, n, k)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), q


def test_tiles_run_as_plain_python():
    """NUMBA_DISABLE_JIT=1 (a child process): the numpy forms of the packing, quantiser and tile."""
    code = (
        "import sys, numpy as np; sys.path.insert(0, %r)\n"
        "from tallow.backends.cpu.runtime import kernel_calls\n"
        "import test_int_tiles_32 as t\n"
        "kernel_calls.kernels()\n"
        "kernel_calls.TILE_32_MAX_ROWS = 128\n"
        "rng = np.random.default_rng(3)\n"
        "for q in t.FORMATS:\n"
        "    for blocks in (3, 28):\n"
        "        t._check(q, 5, 32 * blocks, 11, rng)\n"
        "print('ok')\n") % HERE
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", TALLOW_THREADS="1")
    env.pop("TALLOW_CPU", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_prompt_products_take_these_tiles(monkeypatch):
    """q4_0 / q5_0 / q8_0 products of FUSED_MAX_ROWS + 1 to TILE_32_MAX_ROWS rows run quantize_32 and
    tile32_shared; q4_1 / q5_1 not (TILE_MIN_32_MAX_ROWS = 0: dequantise-then-BLAS, exact)."""
    rng = np.random.default_rng(9)
    kernel_calls.set_threads(1)  # (on a pool every thread calls the kernel)
    calls = []
    mod = kernel_calls._state["tiles_32"]
    real = mod.tile32_shared
    monkeypatch.setattr(mod, "tile32_shared", lambda *a: calls.append(a[0]) or real(*a))
    x = rng.standard_normal((12, 64)).astype(np.float32)
    for q in FORMATS + ("q4_1", "q5_1"):
        raw = random_blocks(q, 8 * 64 // 32, rng)
        got = kernel_calls.qmatmul(x, raw, q, 8, 64)
        w = dequantize_numpy(raw, q, 8 * 64).reshape(8, 64)
        if q in FORMATS:
            assert calls[-1] == CODE[q]
        else:
            assert np.allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)
    assert len(calls) == 3


@pytest.mark.slow
def test_prompt_logits_near_the_blas_path(tmp_path):
    """A 2-layer Qwen2.5-0.5B-shaped file (llama.cpp's Q4_K_M mix: q/k/v/o, gate/up Q5_0 / Q8_0 since 896
    is not a multiple of 256) and its 20-token prompt, every position's logits with these tiles against
    the same model's f32 tiles into BLAS on those matrices (the K-quant matrices on their tiles in both):
    the 8-bit activations' error within the 1.5% of the largest logit that test_int_tiles holds the tiles
    to against transformers (measured: 0.99%; the decoding steps' 16-bit kernels on every matrix 0.78%),
    90% of the greedy tokens equal."""
    import tallow
    sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
    import make_synthetic_gguf as maker
    sys.path.pop(0)
    path = tmp_path / "qwen2.gguf"
    maker.write(str(path), "qwen2", "q4_k_m", scale=1 / 7, layers=2, vocab=1024)
    model = tallow.load_model(str(path), device="cpu")
    prompt = [3, 17, 99, 5, 200, 31, 7, 400, 12, 88, 61, 2, 150, 77, 9, 301, 45, 23, 600, 8]
    got = model(prompt).numpy()[0]
    model.reset()
    kernel_calls.TILE_32_MAX_ROWS = 0
    want = model(prompt).numpy()[0]
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert 0 < err <= 1.5e-2 * scale, f"max |diff| {err:.3g} (logits up to {scale:.3g})"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9
