"""The prompt's integer GEMM tiles (core/backends/cpu/kernels/int_tiles.py): the int8 activation
quantiser against gguf's rounding, every format's tiles against dequantise-then-numpy (odd shapes:
weight rows not a multiple of the tile, 1-3 activation rows past the last whole tile, 1 and 2
threads), the same in plain Python (NUMBA_DISABLE_JIT=1, a child process), and a K-quant file's
prompt logits against transformers loading the same GGUF."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from tallow.dtypes import get_dtype  # noqa: E402
from tallow.quant import dequantize_numpy  # noqa: E402
from tallow.backends.cpu.runtime import kernel_calls  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from random_blocks import FORMATS, random_blocks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    for name in ("TALLOW_CPU", "TALLOW_CPU_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    if kernel_calls.kernels() is None:
        pytest.skip("CPU kernels unavailable")
    # the 32-value formats' tiles are off by default (kernel_calls.TILE_32_MAX_ROWS): tested on as well
    monkeypatch.setattr(kernel_calls, "TILE_32_MAX_ROWS", kernel_calls.TILE_MAX_ROWS)
    monkeypatch.setattr(kernel_calls, "TILE_MIN_32_MAX_ROWS", kernel_calls.TILE_MAX_ROWS)  # (q4_1 / q5_1)
    yield
    monkeypatch.undo()
    kernel_calls.set_threads(kernel_calls.thread_count())


def _group(q):
    return 256 if get_dtype(q).block_size == 256 else 32


def _quantised(x, group):
    from tallow.backends.cpu.kernels import int_tiles
    m, k = x.shape
    qx, dx = np.empty((m, k), np.uint8), np.empty((m, k // group), np.float32)
    s32, s16 = np.empty((m, k // 32), np.int32), np.empty((m, k // 16), np.int32)
    kernel_calls._state["tiles"].quantize_i8(x, group, qx, dx, s32, s16)
    return qx, dx, s32, s16, int_tiles


@pytest.mark.parametrize("group", [32, 256])
def test_activation_quantiser_matches_gguf_rounding(group):
    """Values round(x / d) (gguf's np_roundf: half away from zero, ties included), d = amax / 127 per
    group in float32, an all-zero group all zeros; the 16- and 32-value sums are the values' sums."""
    from gguf.quants import np_roundf
    rng = np.random.default_rng(group)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, :group] = 0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5  # many exact .5 ties when the group is 32
    qx, dx, s32, s16, _ = _quantised(x, group)
    blocks = x.reshape(3, -1, group)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    want = np_roundf(blocks * inv).astype(np.int32).reshape(3, 512)
    assert np.array_equal(qx.view(np.int8).astype(np.int32), want)
    assert np.array_equal(dx, d.reshape(3, -1))
    assert np.array_equal(s16, want.reshape(3, -1, 16).sum(axis=2))
    assert np.array_equal(s32, want.reshape(3, -1, 32).sum(axis=2))
    assert not qx[0, :group].any() and np.abs(qx.view(np.int8)).max() == 127


def _check(q, n, k, m, rng, raw=None, x=None):
    """qmatmul of m rows (the tiles' path) against the int8 activations times the dequantised weights
    (float32 rounding only) and against the float activations (within the 8-bit step's bound).
    raw, x: the blocks and activations (default random)."""
    raw = random_blocks(q, n * k // get_dtype(q).block_size, rng) if raw is None else raw
    w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32) if x is None else x
    got = kernel_calls.qmatmul(x, raw, q, n, k)
    assert got.shape == (m, n) and got.dtype == np.float32
    group = _group(q)
    qx, dx, _s32, _s16, int_tiles = _quantised(x, group)
    xq = int_tiles.activations(qx, dx, group)
    scale = np.abs(xq) @ np.abs(w).T
    assert np.all(np.abs(got - xq @ w.T) <= 2e-6 * scale + 1e-6), q
    # each int8 value is within half a step d / 2 of x: the dot within sum over groups of d/2 * sum |w|
    bound = (np.abs(w).reshape(n, k // group, group).sum(axis=2) @ (dx.astype(np.float64) / 2).T).T
    assert np.all(np.abs(got - x.astype(np.float64) @ w.T) <= bound + 2e-6 * scale + 1e-6), q


@pytest.mark.parametrize("q", FORMATS)
def test_tiles_match_dequantised_numpy(q, monkeypatch):
    from tallow.backends.cpu.kernels import int_tiles
    rng = np.random.default_rng(FORMATS.index(q))
    bs = get_dtype(q).block_size
    tile_w, tile_x = int_tiles.K_TILE if bs == 256 else int_tiles.TILE_32
    m0 = kernel_calls.FUSED_MAX_ROWS + 1
    for threads in (1, 2):
        kernel_calls.set_threads(threads)
        for n, k, m in ((1, bs, m0), (tile_w + 1, 3 * bs, 2 * tile_x + 1), (2 * tile_w + 3, 2 * bs, 2 * tile_x + 2),
                        (37, 5 * bs, 3 * tile_x + 3), (19, bs, int_tiles.X_CHUNK + tile_x + 1)):
            assert kernel_calls.FUSED_MAX_ROWS < m <= min(kernel_calls.TILE_MAX_ROWS, kernel_calls.TILE_32_MAX_ROWS)
            _check(q, n, k, m, rng)


@pytest.mark.parametrize("q", ["q4_k", "q5_k", "q6_k"])
def test_k_tiles_at_their_integer_bounds(q):
    """The K-quant tiles' int16 and int32 intermediates at their extremes: every quant its largest
    (q4_k 15, q5_k 31, q6_k 63), q4_k / q5_k's 6-bit scales and mins 63, q6_k's scales -128 (its
    -32 offset: -32 x -128 x a 16-value sum of 16 x 127 in one vpdpwssd), activations all +-127
    (constant rows, alternating signs by block, one row alternating within 16 values)."""
    rng = np.random.default_rng(11)
    bs = get_dtype(q).block_size
    n, k, m = 5, 2 * bs, 2 * kernel_calls.FUSED_MAX_ROWS + 3
    raw = random_blocks(q, n * k // bs, rng).reshape(-1, get_dtype(q).block_bytes)
    if q == "q6_k":
        raw[:, :192] = 255  # ql and qh: every quant 63
        raw[:, 192:208] = 128  # int8 scales -128
    else:
        raw[:, 4:16] = 255  # 6-bit scales and mins 63
        raw[:, 16 if q == "q4_k" else 48:] = 255  # quants 15 (q5_k: and the high bits, 31)
        if q == "q5_k":
            raw[:, 16:48] = 255
    x = np.ones((m, k), np.float32)
    x[1::2] = -1
    x[2, bs:] = -1
    x[3] = np.where(np.arange(k) % 2 == 0, 1, -1)
    _check(q, n, k, m, rng, raw=raw.reshape(-1), x=x)


@pytest.mark.parametrize("form", ["generic", "avx2", "avx512bw"])
def test_k_tiles_other_instruction_sets(form, monkeypatch):
    """The K-quant tile compiled as other hosts get it (the IR chosen at compile time): the generic
    form of arm64 / wasm (bytes widened to 16 bits), AVX2 without VNNI (256-bit halves,
    vpmaddubsw + vpmaddwd) and AVX-512BW without VNNI, each against tile_py on random and extreme
    blocks (every quant its largest, activations +-127), every weight / activation row clamp."""
    from numba import njit
    from tallow.backends.cpu.kernels import codes, int_tiles, kquant_ir, vector_ir
    if form != "generic" and not vector_ir._X86_MADD:
        pytest.skip("not an x86 host with AVX2: only the generic form is generated here")
    if form == "avx512bw" and not int_tiles._X86_512:
        pytest.skip("this CPU has no AVX-512BW")
    monkeypatch.setattr(kquant_ir, "_BYTE_DOT", None if form == "generic" else "avx2")
    monkeypatch.setattr(int_tiles, "_X86_512", form == "avx512bw")
    monkeypatch.setattr(int_tiles, "_VNNI_512", False)
    tw, tx = int_tiles.K_TILE
    tile = int_tiles._make_tile(tw, tx, (5, 6, 7), scratch=True)
    unpack = int_tiles._make_unpack(tw)

    @njit
    def run(fmt, raw, nw, blocks, block_bytes, qx, dx, s32, s16, table, out):
        wk = np.empty(tw * blocks * int_tiles.K_UNPACKED, np.uint8)
        for r in range(0, nw, tw):
            unpack(fmt, raw, r, min(tw, nw - r), blocks, block_bytes, table, wk)
            for i in range(0, qx.shape[0], tx):
                tile(fmt, wk, r, min(tw, nw - r), blocks, block_bytes, qx, dx, s32, s16, table, out, i)
    rng = np.random.default_rng(5)
    for q in ("q4_k", "q5_k", "q6_k"):
        d = get_dtype(q)
        n, k, m = 2 * tw + 1, 2 * d.block_size, tx + 3
        for extreme in (False, True):
            raw = random_blocks(q, n * k // d.block_size, rng).reshape(n * k // d.block_size, d.block_bytes)
            x = rng.standard_normal((m, k)).astype(np.float32)
            if extreme:
                raw[:, :192 if q == "q6_k" else None][:, 4 if q != "q6_k" else 0:] = 255
                x = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32) * np.ones((m, 1), np.float32)
            raw = raw.reshape(-1)
            qx, dx = np.empty((m, k), np.uint8), np.empty((m, k // 256), np.float32)
            s32, s16 = np.empty((m, k // 32), np.int32), np.empty((m, k // 16), np.int32)
            int_tiles.quantize_k(x, qx, dx, s32, s16)
            got, want = np.full((m, n), np.nan, np.float32), np.zeros((m, n), np.float32)
            fmt = int_tiles.NAMES.index(q)
            run(fmt, raw, n, k // 256, d.block_bytes, qx, dx, s32, s16, codes.F16_TABLE, got)
            for i0 in range(0, m, tx):
                int_tiles.tile_py(fmt, raw, 0, n, k // 256, d.block_bytes, qx, dx, s32, s16, codes.F16_TABLE, want,
                                  i0, tx)
            w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
            scale = int_tiles.activations(int_tiles.natural_order(qx), dx, 256).__abs__() @ np.abs(w).T
            assert np.all(np.abs(got - want) <= 2e-6 * scale + 1e-6), (q, form, extreme)


def test_k_order_round_trip():
    """quantize_k equals quantize_i8(x, 256, ...) with each block's values in K_ORDER."""
    from tallow.backends.cpu.kernels import int_tiles
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    x[0, :256] = 0  # an all-zero block (d = 0)
    x[1, 256:512] = -0.0
    x[1, 300] = -1e-30
    x[2, 512:] = (np.arange(256) - 127.5).astype(np.float32)  # many exact halves
    qx, dx, s32, s16, _ = _quantised(x, 256)
    got = [np.empty_like(a) for a in (qx, dx, s32, s16)]
    int_tiles.quantize_k(x, *got)
    assert np.array_equal(got[0].reshape(3, 3, 256), qx.reshape(3, 3, 256)[:, :, int_tiles.K_ORDER])
    assert np.array_equal(int_tiles.natural_order(got[0]), qx)
    for a, b in zip(got[1:], (dx, s32, s16)):
        assert np.array_equal(a, b)


def test_tiles_run_as_plain_python():
    """NUMBA_DISABLE_JIT=1 (a child process): tile_py in place of the IR, the same products."""
    code = (
        "import sys, numpy as np; sys.path.insert(0, %r)\n"
        "from tallow.backends.cpu.runtime import kernel_calls\n"
        "import test_int_tiles as t\n"
        "kernel_calls.kernels()\n"
        "kernel_calls.TILE_32_MAX_ROWS = kernel_calls.TILE_MAX_ROWS\n"
        "rng = np.random.default_rng(3)\n"
        "for q in ('q4_0', 'q8_0', 'q4_k', 'q6_k'):\n"
        "    bs = t.get_dtype(q).block_size\n"
        "    t._check(q, 5, 2 * bs, 11, rng)\n"
        "print('ok')\n") % HERE
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", TALLOW_THREADS="1")
    env.pop("TALLOW_CPU", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_prompt_products_take_the_tiles(monkeypatch):
    """Rows past FUSED_MAX_ROWS and up to TILE_32_MAX_ROWS (TILE_MAX_ROWS on K-quants) run int_tiles'
    kernel, above it BLAS (the tiles' product differs from BLAS's by the activations' 8-bit rounding)."""
    rng = np.random.default_rng(9)
    raw = random_blocks("q5_0", 8 * 64 // 32, rng)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    calls = []
    real = kernel_calls._tile_product
    monkeypatch.setattr(kernel_calls, "_tile_product", lambda *a: calls.append(a) or real(*a))
    tiles = kernel_calls.qmatmul(x, raw, "q5_0", 8, 64)
    assert len(calls) == 1
    monkeypatch.setattr(kernel_calls, "TILE_32_MAX_ROWS", 11)
    blas = kernel_calls.qmatmul(x, raw, "q5_0", 8, 64)
    assert len(calls) == 1 and not np.array_equal(tiles, blas)
    w = dequantize_numpy(raw, "q5_0", 8 * 64).reshape(8, 64)
    assert np.allclose(blas, x @ w.T, rtol=1e-5, atol=1e-5)


PROMPT = [3, 17, 99, 5, 200, 31, 7, 400, 12, 88, 61, 2, 150, 77, 9, 301, 45, 23, 600, 8]  # 20 rows: the tiles


@pytest.mark.slow
@pytest.mark.parametrize("arch,scale,kinds", [
    ("qwen2-1.5b", 1 / 3, {"tallow.f32", "tallow.q4_k", "tallow.q6_k"}),
    ("qwen2", 1 / 7, {"tallow.f32", "tallow.q5_0", "tallow.q8_0", "tallow.q4_k", "tallow.q6_k"})],
    ids=["qwen2-1.5b", "qwen2-0.5b-fallbacks"])
def test_prompt_logits_match_transformers(tmp_path, arch, scale, kinds):
    """Every position's logits of a 20-token prompt (all products on the tiles) against transformers
    loading the same Q4_K_M-recipe GGUF (gguf-py dequantises the blocks to float32 there); the
    0.5B shape's 128-wide rows are not whole 256-blocks, so it has llama.cpp's Q5_0 / Q8_0 fallbacks."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    import tallow
    sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
    import make_synthetic_gguf as maker
    sys.path.pop(0)
    path = tmp_path / f"{arch}.gguf"
    maker.write(str(path), arch, "q4_k_m", scale=scale, layers=2, vocab=1024)
    f = tallow.io.open(str(path))
    assert {str(f.info(n).dtype) for n in f.keys()} == kinds
    ref = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT])).logits[0].numpy()
    got = tallow.load_model(str(path), device="cpu")(PROMPT).numpy()[0]
    assert got.shape == want.shape
    scale_ = float(np.abs(want).max())
    assert scale_ > 0.5
    # int8 activations (one scale per 256 values on K-quant rows, per 32 on the others, as ggml's
    # prompt path): llama.cpp's own error on such files is 0.17-0.92% of the logits' range
    err = float(np.abs(got - want).max())
    assert err <= 1.5e-2 * scale_, f"max |diff| {err:.3g} (logits up to {scale_:.3g})"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9
