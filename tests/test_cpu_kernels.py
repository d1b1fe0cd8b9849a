"""The numba kernels on GGUF blocks (tallow.backends.cpu.runtime.kernel_calls) against dequantise-then-numpy,
whose dequantisation is bit-exact with the `gguf` package (tests/test_quant.py)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tallow
from tallow.dtypes import get_dtype
from tallow.errors import FormatError, ShapeError
from tallow.quant import dequantize_numpy

pytest.importorskip("numba")
from tallow.backends.cpu.kernels import atomics
from tallow.backends.cpu.runtime import kernel_calls, polls
from tallow.backends.operand import QKV, KVCache, QuantWeight, Rotary, operand_of
from tallow.backends.specs import CacheAttentionSpec, LinearSpec, NormSpec

from kquant_reference import K_QUANTS, kquant_product  # noqa: E402
from random_blocks import FORMATS, random_blocks as _blocks  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    for name in ("TALLOW_CPU", "TALLOW_CPU_KERNELS", "TALLOW_NATIVE_KERNELS", "TALLOW_CPU_STEP_PROGRAM"):
        monkeypatch.delenv(name, raising=False)
    yield
    monkeypatch.undo()
    kernel_calls.set_threads(kernel_calls.thread_count())


def _use_threads(n, monkeypatch):
    """n threads, every decoding-step product shared among them (PARALLEL_MIN_BYTES 0) when n > 1."""
    kernel_calls.set_threads(n)
    monkeypatch.setattr(kernel_calls, "PARALLEL_MIN_BYTES", 0 if n > 1 else 1 << 40)


def _q8_reference(x):
    """ggml's 8-bit activation blocks, from the `gguf` package's Q8_0 quantiser: (int8 values, their
    float32 scales amax/127). gguf stores the scale as f16; the kernels keep it in float32."""
    from gguf import GGMLQuantizationType, quants
    m, k = x.shape
    blocks = quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(m, k // 32, 34)
    qs = blocks[..., 2:].copy().view(np.int8).reshape(m, k)
    d = np.abs(x.reshape(m, k // 32, 32)).max(axis=2) / np.float32(127)
    return qs, d.astype(np.float32)


def _activation_reference(x, qmax=kernel_calls.ACTIVATION_MAX):
    """The same blocks with qmax levels a side (the kernels' 16 bits), rounded by gguf's np_roundf."""
    from gguf.quants import np_roundf
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(qmax)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return np_roundf(blocks * inv).astype(np.int32).reshape(m, k), d.reshape(m, k // 32)


def _check(q, n, k, m, rng):
    raw = _blocks(q, n * k // get_dtype(q).block_size, rng)
    w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = kernel_calls.qmatmul(x, raw, q, n, k)
    assert got.shape == (m, n) and got.dtype == np.float32
    kquant_rows = q in K_QUANTS and m <= kernel_calls.KQUANT_FUSED_MAX_ROWS  # (K-quant prompts: integer kernels)
    if m > kernel_calls.FUSED_MAX_ROWS and not kquant_rows:  # the prompt path: float weights times float x, via BLAS
        ref = x.astype(np.float64) @ w.T
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T
        assert np.all(np.abs(got - ref) <= 1e-5 * scale + 1e-6), q
        return
    # Decoding: x is quantised per 32-value block as ggml does (16 bits; the K-quants' kernels then
    # take 8 of them: kquant_reference), then the dot is exact up to float32 summation order: so
    # against the dequantised activations the error is rounding only...
    qs, d = _activation_reference(x)
    xq = (qs.reshape(m, k // 32, 32) * d[..., None].astype(np.float64)).reshape(m, k)
    ref_q, bound8 = kquant_product(w, qs, d) if q in K_QUANTS else (xq @ w.T, 0)
    scale = np.abs(xq) @ np.abs(w).T
    assert np.all(np.abs(got - ref_q) <= 2e-5 * scale + 1e-6), q
    # ...and against the float activations it is ggml's own: each value is off by at most half a
    # step d/2, so the dot by at most sum over blocks of d/2 * sum |w| (plus the rounding above;
    # the K-quants: plus the 8-bit step's half).
    bound = (np.abs(w).reshape(n, k // 32, 32).sum(axis=2) @ (d.astype(np.float64) / 2).T).T + bound8
    ref = x.astype(np.float64) @ w.T
    assert np.all(np.abs(got - ref) <= bound + 2e-5 * scale + 1e-6), q


@pytest.mark.parametrize("bits", [8, 16])
def test_activation_quantisation_matches_gguf(bits):
    """8 bits: exactly gguf.quants' Q8_0 values (round half away from zero, ties and zero blocks
    included), with float32 scales; 16 bits (what the kernels use): the same rounding with 32767
    levels. The block sums are the values' sums."""
    from tallow.backends.cpu.kernels import int_dot
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block: scale 0, values 0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5  # 127 * v / 15.5: many exact .5 ties
    x[2, 5] = 0.49999997 * float(np.abs(x[2, :32]).max()) / 127  # just below a tie
    qmax, dtype = (127, np.int8) if bits == 8 else (32767, np.int16)
    qx, dx = np.empty((3, 96), dtype), np.empty((3, 3), np.float32)
    sx = np.empty((3, 3), np.int32)
    int_dot.quantize_rows(x, qmax, qx, dx, sx)
    qs, d = _q8_reference(x) if bits == 8 else _activation_reference(x, qmax)
    assert np.array_equal(qx, qs)
    assert np.array_equal(dx, d)
    assert np.array_equal(sx, qs.reshape(3, 3, 32).sum(axis=2, dtype=np.int32))
    assert np.abs(qx).max() == qmax


@pytest.mark.parametrize("q", FORMATS)
def test_kernels_match_dequantised_numpy(q, monkeypatch):
    """Odd row counts, rows of several blocks (k a multiple of the block, not of 64 or 512),
    one row (decode), a few rows (fused kernel) and many (tiled BLAS path: a short prompt's w x^T and
    a long one's x w^T), on 1 and 2 threads. (Prompts on the integer tiles instead: test_int_tiles.py.)"""
    monkeypatch.setattr(kernel_calls, "TILE_MAX_ROWS", 0)
    monkeypatch.setattr(kernel_calls, "TILE_32_MAX_ROWS", 0)
    rng = np.random.default_rng(FORMATS.index(q))
    bs = get_dtype(q).block_size
    for threads in (1, 2):
        _use_threads(threads, monkeypatch)
        for n, k, m in ((1, bs, 1), (37, 3 * bs, 1), (21, 5 * bs, 3), (19, 3 * bs, kernel_calls.FUSED_MAX_ROWS + 5),
                        (19, 3 * bs, kernel_calls.FEW_PROMPT_ROWS + 7), (5, bs, kernel_calls.KQUANT_FUSED_MAX_ROWS + 1)):
            _check(q, n, k, m, rng)


@pytest.mark.parametrize("m", [20, kernel_calls.FEW_PROMPT_ROWS + 3])
def test_tiled_path_covers_ragged_last_tile(m, monkeypatch):
    monkeypatch.setattr(kernel_calls, "TILE_ELEMENTS", 64 * 3)  # 3 rows a tile, 10 rows: a ragged last tile
    monkeypatch.setattr(kernel_calls, "TILE_32_MAX_ROWS", 0)  # (BLAS's tiles, not the integer ones)
    _check("q8_0", 10, 64, m, np.random.default_rng(5))


@pytest.mark.parametrize("q", FORMATS)
def test_embedding_rows_are_bit_exact(q):
    rng = np.random.default_rng(7)
    k, n = 2 * get_dtype(q).block_size, 9
    raw = _blocks(q, n * 2, rng)
    full = dequantize_numpy(raw, q, n * k).reshape(n, k)
    ids = np.array([3, 0, 8, 3])
    got = kernel_calls.dequant_rows(raw, q, k, ids)
    assert np.array_equal(got.view(np.uint32), full[ids].view(np.uint32))
    with pytest.raises(FormatError, match="out of range"):
        kernel_calls.dequant_rows(raw, q, k, [n])


def _f16_check(n, k, m, rng):
    """kernel_calls.f16_matmul against float64 numpy on the same f16 values (+ a bias)."""
    w = rng.standard_normal((n, k)).astype(np.float16)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 3e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.astype(np.float64)).T) + 1e-6  # float32 sums
    assert np.all(np.abs(kernel_calls.f16_matmul(x, w.view(np.uint16)) - want) <= bound)
    assert np.all(np.abs(kernel_calls.f16_matmul(x, w.view(np.uint16), bias) - (want + bias)) <= bound + 1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_f16_matmul(threads):
    """Odd row counts, k not a multiple of the 16-value vector (the tail), one and several rows of
    x, a matrix large enough for the pool's threads to share."""
    kernel_calls.kernels()
    kernel_calls.set_threads(threads)
    rng = np.random.default_rng(3)
    for n, k, m in [(13, 70, 2), (1, 16, 1), (7, 5, 3), (1501, 384, 1), (513, 1536, 5)]:
        _f16_check(n, k, m, rng)
    with pytest.raises(ShapeError, match="expected last dim 70"):
        kernel_calls.f16_matmul(np.zeros((1, 69), np.float32), np.zeros((3, 70), np.uint16))
    with pytest.raises(ShapeError, match="uint16 array of f16 bits"):
        kernel_calls.f16_matmul(np.zeros((1, 4), np.float32), np.zeros((3, 4), np.float16))


def test_bad_shapes_raise_tallow_errors():
    raw = _blocks("q4_0", 4, np.random.default_rng(0))
    with pytest.raises(ShapeError, match="multiple of the block size"):
        kernel_calls.qmatmul(np.zeros((1, 48), np.float32), raw[:18 * 3], "q4_0", 2, 48)
    with pytest.raises(ShapeError, match="last dim 64"):
        kernel_calls.qmatmul(np.zeros((1, 32), np.float32), raw, "q4_0", 2, 64)
    with pytest.raises(FormatError, match="need 72 bytes"):
        kernel_calls.qmatmul(np.zeros((1, 64), np.float32), raw[:-1], "q4_0", 2, 64)


def test_backend_keeps_weights_quantised_with_kernels_and_copies_only_when_asked(monkeypatch):
    from tallow.backends.cpu import backend
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)

    def quantised():  # a fresh weight each time: the copies are keyed by the weight's storage
        return tallow.from_numpy(w).to(get_dtype("q4_0"))

    wq = quantised()
    deq = wq.to(tallow.f32).numpy()
    qs, d = _activation_reference(x)
    x_q = (qs.reshape(2, 32) * d.reshape(2, 1)).reshape(1, 64)  # what the kernels multiply
    used = backend._DEQUANT_CACHE.used
    monkeypatch.delenv("TALLOW_QUANT_CACHE_MB", raising=False)  # default: the kernels read the blocks
    np.testing.assert_allclose((tallow.from_numpy(x) @ wq.T).numpy(), x_q @ deq.T, rtol=1e-5, atol=1e-5)
    assert backend._DEQUANT_CACHE.used == used  # no f32 copy
    ids = tallow.from_numpy(np.array([5, 0], dtype=np.int64))
    np.testing.assert_array_equal(wq.index_select(0, ids).numpy(), deq[[5, 0]])  # an embedding lookup
    monkeypatch.setenv("TALLOW_QUANT_CACHE_MB", "1")  # asked for: an f32 copy within the budget
    w2 = quantised()  # held: a copy lives as long as its weight
    np.testing.assert_allclose((tallow.from_numpy(x) @ w2.T).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)
    assert backend._DEQUANT_CACHE.used == used + w.size * 4
    monkeypatch.delenv("TALLOW_QUANT_CACHE_MB")
    monkeypatch.setenv("TALLOW_CPU", "numpy")  # no kernels (as without numba): today's default copies
    assert not kernel_calls.supports("q4_0")
    w3 = quantised()
    np.testing.assert_allclose((tallow.from_numpy(x) @ w3.T).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)
    assert backend._DEQUANT_CACHE.used == used + 2 * w.size * 4
    monkeypatch.setenv("TALLOW_QUANT_CACHE_MB", "lots")
    with pytest.raises(tallow.Error, match="TALLOW_QUANT_CACHE_MB='lots'"):
        tallow.from_numpy(x) @ quantised().T


def test_import_tallow_does_not_import_numba():
    """Nor do float ops, the fused decode ops included (a float model does not load numba)."""
    code = ("import sys, tallow; from tallow import functional as F; x = tallow.ones(1, 8)\n"
            "F.add_rms_norm(x, x, tallow.ones(8)); F.add_layer_norm(x, x)\n"
            "q = tallow.ones(1, 2, 1, 4); F.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), check=True)
    assert out.stdout.strip() == "False"


def test_kernels_run_as_plain_python():
    """NUMBA_DISABLE_JIT=1: the same kernel source runs as Python on small shapes (so it stays readable)."""
    code = (
        "import numpy as np, sys; sys.path[:0] = [sys.argv[1]]\n"
        "from test_cpu_kernels import _check, FORMATS\n"
        "from tallow.backends.cpu.runtime import kernel_calls\n"
        "kernel_calls.TILE_MAX_ROWS = kernel_calls.TILE_32_MAX_ROWS = 0\n"  # (integer tiles: test_int_tiles.py)
        "rng = np.random.default_rng(0)\n"
        "for q in FORMATS:\n"
        "    bs = 256 if q.endswith('_k') else 32\n"
        "    _check(q, 3, bs, 1, rng); _check(q, 2, bs, kernel_calls.FUSED_MAX_ROWS + 1, rng)\n"
        "from test_cpu_kernels import _f16_check\n"
        "kernel_calls.kernels()\n"
        "_f16_check(5, 37, 2, rng)\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _dequantised_product_bound(x, w, q, raw):
    """(x . w.T in float64, its allowed error): the 16-bit activation quantisation bound (the
    K-quants: plus the 8-bit one, kquant_reference) plus rounding."""
    m, k = x.shape
    qs, d = _activation_reference(x)
    ref = x.astype(np.float64) @ w.T
    bound = (np.abs(w).reshape(w.shape[0], k // 32, 32).sum(axis=2) @ (d.astype(np.float64) / 2).T).T
    if q in K_QUANTS:
        bound = bound + kquant_product(w, qs, d)[1]
    return ref, bound + 2e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).T) + 1e-6


@pytest.mark.parametrize("q", ["q4_1", "q5_0", "q8_0", "q6_k"])
@pytest.mark.parametrize("parallel", [False, True])
def test_gated_and_biased_products_match_dequantised_numpy(q, parallel, monkeypatch):
    """The decoding-step kernel with SwiGLU inside (gate and up rows in one pass) and with a bias,
    on one thread and (PARALLEL_MIN_BYTES 0: every product shared out) on 2 threads."""
    _use_threads(2 if parallel else 1, monkeypatch)
    rng = np.random.default_rng(21)
    bs = get_dtype(q).block_size
    n, k, m = 37, 2 * bs, 2  # 37 rows: 4 chunks of unequal size on 2 threads
    raw = _blocks(q, 2 * n * k // bs, rng)
    w = dequantize_numpy(raw, q, 2 * n * k).reshape(2 * n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y, err = _dequantised_product_bound(x, w, q, raw)
    g, u, eg, eu = y[:, :n], y[:, n:], err[:, :n], err[:, n:]
    silu = 0.5 * g * (1 + np.tanh(g / 2))  # g * sigmoid(g), without overflow
    got = kernel_calls.gated_qmatmul(x, raw, q, n, k, "silu")
    assert got.shape == (m, n) and got.dtype == np.float32
    assert np.all(np.abs(got - silu * u) <= 1.1 * eg * (np.abs(u) + eu) + np.abs(silu) * eu + 1e-4), q
    gelu_tanh = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
    for act, fn, slope in (("relu", lambda v: np.maximum(v, 0), 1.0), ("gelu_tanh", gelu_tanh, 1.13)):
        got, a = kernel_calls.gated_qmatmul(x, raw, q, n, k, act), fn(g)
        assert np.all(np.abs(got - a * u) <= slope * eg * (np.abs(u) + eu) + np.abs(a) * eu + 1e-4 * (1 + np.abs(a * u)))
    bias = rng.standard_normal(2 * n).astype(np.float32)
    got = kernel_calls.qmatmul_bias(x, raw, q, 2 * n, k, bias)
    assert np.all(np.abs(got - (y + bias)) <= err + 1e-5 * np.abs(bias)), q


def test_thread_count_comes_from_tallow_threads(monkeypatch):
    monkeypatch.setenv("TALLOW_THREADS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert kernel_calls.thread_count() == 1
    monkeypatch.delenv("TALLOW_THREADS")
    assert kernel_calls.thread_count() == 2
    monkeypatch.setenv("TALLOW_THREADS", "two")
    with pytest.raises(tallow.Error, match="TALLOW_THREADS='two'"):
        kernel_calls.thread_count()


def _composed(method, *args):
    """What base.py's composition of the primitives returns for a fused op (the numpy backend's
    own override skipped)."""
    from tallow.backends.base import Backend
    from tallow.backends.cpu.backend import NumpyBackend
    return getattr(Backend, method)(NumpyBackend(), *args)


def test_decode_kernels_are_what_the_numpy_backend_runs(monkeypatch):
    """With numba's kernels in use, the numpy backend's fused decode ops are the fused_ops /
    integer-dot calls (counted), and they agree with base.py's compositions of the numpy primitives."""
    from tallow import functional as F
    assert kernel_calls.kernels() is not None  # in use (a quantised model's first product loads them)
    calls = []
    for mod, names in ((kernel_calls.decode_kernels(), ("add_rms_norm", "add_layer_norm", "rope_kv_write", "kv_write",
                                             "attention")), (kernel_calls.int_kernels(), ("qmatmul_shared",))):
        for name in names:
            real = getattr(mod, name)
            monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    monkeypatch.setattr(kernel_calls, "PARALLEL_MIN_BYTES", 1 << 40)
    rng = np.random.default_rng(2)
    x, r, w, b = (tallow.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((2, 48), (2, 48), (48,), (48,)))
    total, normed = F.add_rms_norm(x, r, w, 1e-6)
    want = _composed("add_rms_norm", operand_of(x), operand_of(r), operand_of(w), tallow.f32, 1e-6)
    np.testing.assert_array_equal(total.numpy().reshape(-1), want[0])
    np.testing.assert_allclose(normed.numpy().reshape(-1), want[1], rtol=1e-6, atol=1e-6)
    total, normed = F.add_layer_norm(x, r, w, b, 1e-5)
    want = _composed("add_layer_norm", operand_of(x), operand_of(r), operand_of(w), operand_of(b), tallow.f32, 1e-5)
    np.testing.assert_allclose(normed.numpy().reshape(-1), want[1], rtol=1e-5, atol=1e-5)
    wq = tallow.from_numpy(rng.standard_normal((2 * 10, 64)).astype(np.float32)).to(get_dtype("q4_0"))
    xg = tallow.from_numpy(rng.standard_normal((1, 64)).astype(np.float32))
    got = F.gated_linear(xg, wq, "silu")
    seen = len(calls)
    want = _composed("gated_qmatmul", operand_of(xg), QuantWeight(wq._storage, wq.dtype, 20, 64), tallow.f32, "silu")
    del calls[seen:]  # the composition's own plain product
    np.testing.assert_allclose(got.numpy().reshape(-1), want, rtol=1e-5, atol=1e-5)  # same 16-bit activations
    q, k, v = (tallow.from_numpy(rng.standard_normal((1, h, 1, 8)).astype(np.float32)) for h in (4, 2, 2))
    cs = tallow.from_numpy(rng.standard_normal((1, 4)).astype(np.float32))
    kc, vc = tallow.zeros(1, 2, 5, 8), tallow.zeros(1, 2, 5, 8)
    q_rot = F.rope_kv_write(q, k, v, cs, cs, kc.narrow(2, 3, 1), vc.narrow(2, 3, 1), True)
    F.kv_write(k, v, kc.narrow(2, 0, 1), vc.narrow(2, 0, 1))
    out = F.scaled_dot_product_attention(q_rot, kc.narrow(2, 0, 4), vc.narrow(2, 0, 4), is_causal=True)
    assert out.shape == (1, 4, 1, 8)
    assert calls == ["add_rms_norm", "add_layer_norm", "qmatmul_shared", "rope_kv_write", "kv_write", "attention"]


@pytest.mark.parametrize("kind,q,bias,gated", [("rms", "q4_1", False, False), ("rms", "q4_1", False, True),
                                                ("layer", "q8_0", True, False), ("rms", "q4_k", False, True)])
def test_add_norm_linear_decoding_step_is_two_kernel_calls_and_matches_the_composition(kind, q, bias, gated,
                                                                                      monkeypatch):
    """A decoding step's add_norm_linear on quantised weights: the norm kernel hands its output
    array straight to one integer-dot call, with the result of base.py's composition (the same
    16-bit activations, so equal to float rounding)."""
    from tallow import functional as F
    assert kernel_calls.kernels() is not None
    calls = []
    dec, ints = kernel_calls.decode_kernels(), kernel_calls.int_kernels()
    for mod, name in ((dec, "add_rms_norm"), (dec, "add_layer_norm"), (ints, "qmatmul_shared")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    rng = np.random.default_rng(5)
    k, rows = 256, 24
    x, r = (tallow.from_numpy(rng.standard_normal((1, 2, k)).astype(np.float32)) for _ in range(2))
    nw, nb = (tallow.from_numpy(rng.standard_normal(k).astype(np.float32)) for _ in range(2))
    w = tallow.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).to(get_dtype(q))
    b = tallow.from_numpy(rng.standard_normal(rows).astype(np.float32)) if bias else None
    hidden, y = F.add_norm_linear(x, r, nw, nb if kind == "layer" else None, w, b, kind, 1e-5,
                                  "silu" if gated else None, gated)
    assert calls == [f"add_{kind}_norm", "qmatmul_shared"]
    norm = NormSpec(operand_of(nw), operand_of(nb if kind == "layer" else None), 1e-5, kind == "layer")
    linear = LinearSpec(QuantWeight(w._storage, w.dtype, rows, k), operand_of(b), "silu" if gated else None, gated)
    want_total, want_y = _composed("add_norm_linear", operand_of(x), operand_of(r), norm, linear, tallow.f32)
    np.testing.assert_array_equal(hidden.numpy().reshape(-1), want_total)
    assert y.shape == (1, 2, rows // 2 if gated else rows)
    np.testing.assert_allclose(y.numpy().reshape(-1), want_y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotary", [None, False, True])  # no rotation, half-split pairs, interleaved pairs
def test_cache_attention_is_one_kernel_call_and_matches_torch(rotary, monkeypatch):
    """With the kernels in use, a decoding step's cache_attention is one fused_ops call
    (rotation, cache write and attention) for 1 and 3 query rows over a cache that already holds
    keys; the result and the written cache equal base.py's composition, and without rotation
    torch's attention over the cache with the causal mask of those positions."""
    import torch

    from tallow import functional as F
    assert kernel_calls.kernels() is not None
    calls = []
    real = kernel_calls.decode_kernels().cache_attention
    monkeypatch.setattr(kernel_calls.decode_kernels(), "cache_attention", lambda *a: (calls.append(1), real(*a))[1])
    rng = np.random.default_rng(8)
    b, h, hk, d, cap, position = 1, 6, 2, 8, 9, 4
    for t in (1, 3):
        q, k, v = (rng.standard_normal((b, n, t, d)).astype(np.float32) for n in (h, hk, hk))
        old = rng.standard_normal((2, b, hk, cap, d)).astype(np.float32)
        cs = [rng.standard_normal((t, d // 2)).astype(np.float32) for _ in range(2)] if rotary is not None else [None] * 2
        args = [tallow.from_numpy(a) for a in (q, k, v)]
        tables = [None if a is None else tallow.from_numpy(a) for a in cs]
        kc, vc = tallow.from_numpy(old[0].copy()), tallow.from_numpy(old[1].copy())
        got = F.cache_attention(*args, kc, vc, position, *tables, interleaved=bool(rotary), key_start=1)
        assert len(calls) == t // 3 + 1  # one call per step
        kc2, vc2 = tallow.from_numpy(old[0].copy()), tallow.from_numpy(old[1].copy())
        rot = None if rotary is None else Rotary(*map(operand_of, tables), bool(rotary))
        want = _composed("cache_attention", QKV(*map(operand_of, args)), KVCache(operand_of(kc2), operand_of(vc2)),
                         rot, None, tallow.f32, CacheAttentionSpec(position, 1, d ** -0.5))
        np.testing.assert_allclose(got.numpy().reshape(-1), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kc.numpy(), kc2.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(vc.numpy(), vc2.numpy())
        if rotary is None:
            keys = torch.from_numpy(kc.numpy()[:, :, 1:position + t]).repeat_interleave(h // hk, 1)
            values = torch.from_numpy(vc.numpy()[:, :, 1:position + t]).repeat_interleave(h // hk, 1)
            n = position + t - 1
            allowed = torch.arange(n)[None, :] <= torch.arange(t)[:, None] + n - t
            ref = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q), keys, values, attn_mask=allowed)
            np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_decode_kernels_run_as_plain_python():
    """NUMBA_DISABLE_JIT=1: the fused decode kernels' source runs as Python and agrees with numpy."""
    code = (
        "import numpy as np, sys; sys.path[:0] = [sys.argv[1]]\n"
        "from tallow.backends.cpu.kernels import fused_ops as K\n"
        "rng = np.random.default_rng(0)\n"
        "x, r, w = rng.standard_normal((2, 8)), rng.standard_normal((2, 8)), rng.standard_normal(8)\n"
        "t, n = np.empty((2, 8)), np.empty((2, 8))\n"
        "K.add_rms_norm(x, r, w, 1e-6, t, n)\n"
        "s = x + r\n"
        "assert np.allclose(n, s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * w)\n"
        "q, k, v = rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 1, 3, 4)), rng.standard_normal((1, 1, 3, 4))\n"
        "out = np.empty((1, 2, 1, 4), np.float32)\n"
        "K.attention(q, k.reshape(-1), 0, np.array([12, 12, 4]), v.reshape(-1), 0, np.array([12, 12, 4]),\n"
        "            np.array([1, 3, 4]), 0.5, True, out)\n"
        "p = np.exp(q[0, :, 0] @ k[0, 0].T * 0.5); p /= p.sum(-1, keepdims=True)\n"
        "assert np.allclose(out[0, :, 0], p @ v[0, 0], atol=1e-5)\n"
        "kc, vc = np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 4, 4), np.float32)\n"
        "kc[:, :, :2], vc[:, :, :2] = k[:, :, :2], v[:, :, :2]\n"
        "none = np.empty((0, 0), np.float32)\n"
        "K.cache_attention(q, k[:, :, 2:], v[:, :, 2:], none, none, kc, vc, 2, 0, 0.5, False, out)\n"
        "assert np.allclose(out[0, :, 0], p @ v[0, 0], atol=1e-5) and np.allclose(kc[:, :, :3], k)\n"
        "q2 = np.ascontiguousarray(q, np.float32)\n"
        "ck, cv = np.ascontiguousarray(k, np.float32).repeat(2, 1), np.ascontiguousarray(v, np.float32).repeat(2, 1)\n"
        "K.cross_attention_rows(q2, ck, cv, np.float32(0.5), out, 0, 2)\n"
        "assert np.allclose(out[0, :, 0], p @ v[0, 0], atol=1e-5)\n"
        "s = (rng.standard_normal((3, 20)) * 5).astype(np.float32); e = np.exp(s - s.max(-1, keepdims=True))\n"
        "tot = np.empty(3, np.float32); K.softmax_rows(s, tot)\n"
        "assert np.allclose(s, e, rtol=1e-6) and np.allclose(tot, e.sum(-1), rtol=1e-6)\n"
        "from tallow.backends.cpu.kernels import float_rows as R\n"
        "emb, rows = rng.standard_normal((5, 4)).astype(np.float32), np.empty((2, 4), np.float32)\n"
        "R.take_rows(emb, np.array([3, 1]), rows)\n"
        "assert np.array_equal(rows, emb[[3, 1]])\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _count_rows(counts, n_rows, chunks, state):
    """A RowPool kernel (the protocol qmatmul_shared follows): counts[r] += 1 for each row of each chunk taken."""
    last = False
    while True:
        c = atomics.fetch_add(state, 0, 1)
        if c >= chunks:
            return last
        for r in range(n_rows * c // chunks, n_rows * (c + 1) // chunks):
            counts[r] += 1
        if atomics.fetch_add(state, 1, 1) == chunks - 1:
            last = True


def test_row_pool_covers_every_row_once_and_never_waits_for_an_idle_helper():
    """threads.RowPool: the chunks cover range(n) exactly once, in many jobs back to back (the
    helper polling between them); an error in a helper reaches the caller; and while the only
    helper is held elsewhere (as a descheduled thread would be), the caller runs every chunk
    itself instead of waiting."""
    import threading

    from numba import njit

    from tallow.backends.cpu.runtime.threads import RowPool
    kernel = njit(nogil=True)(_count_rows)
    pool = RowPool(2)
    try:
        for n in (1, 3, 37, 1000) * 50:
            counts = np.zeros(n, dtype=np.int64)
            pool.run(kernel, (counts,), n)
            assert np.all(counts == 1), n

        def fail(*args):
            if threading.current_thread() is threading.main_thread():
                return False  # the caller takes no chunk: the helper's error must end the wait
            raise ShapeError("chunk failed")
        with pytest.raises(ShapeError, match="chunk failed"):
            pool.run(fail, (), 8)
        release, held = threading.Event(), threading.Event()

        freed = threading.Event()

        class Stuck:  # occupies the helper thread, as a descheduled thread would be
            def work(self):
                held.set()
                release.wait(30)
                freed.set()
        pool.jobs.put(Stuck())
        assert held.wait(10)
        counts = np.zeros(8, dtype=np.int64)
        pool.run(kernel, (counts,), 8)
        # Every chunk ran while the helper was still held: run() did not wait for it to come free.
        assert np.all(counts == 1) and not freed.is_set()
        release.set()
    finally:
        pool.close()


def test_a_polling_helper_sees_the_next_job_without_holding_the_gil():
    """atomics: the poll runs without the GIL (the thread that bumps the counter needs it) and
    sees the bump through its atomic load (a hoisted plain load would never see it); with no
    bump it gives up after its rounds."""
    import threading

    counter = np.zeros(1, dtype=np.int64)
    assert polls.wait_while_equal(counter, 0, 0, 1000) is False

    def bump():
        time.sleep(0.05)
        counter[0] = 1
    bumper = threading.Thread(target=bump)
    guard = polls.rounds_for(60_000_000)  # about a minute of polling: a hang guard, not a timing
    bumper.start()
    assert polls.wait_while_equal(counter, 0, 0, guard) is True  # the bump was seen before the guard ran out
    bumper.join()
    assert polls.rounds_for(100) >= 1
