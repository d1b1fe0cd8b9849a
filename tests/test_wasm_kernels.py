"""kernels.wasm (tallow.backends.wasm: the CPU kernels' IR lowered to wasm32 + SIMD128) run under
wasmtime against numpy: the quantised products against dequantise-then-numpy (dequant_numpy is
bit-exact with gguf), within float32 rounding of the quantised activations and within the
activation-quantisation bound of the float ones; dequantisation and the f16 table bit-exact;
the float kernels to 1e-5 relative."""
import math
import os

import numpy as np
import pytest

from tallow.dtypes import get_dtype
from tallow.quant import dequantize_numpy

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)

from kquant_reference import K_QUANTS, kquant_product  # noqa: E402
from random_blocks import FORMATS, random_blocks as _blocks  # noqa: E402

QMAX = 32767
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wasm():
    return Kernels(build.build())


def _activation_reference(x):
    """int_dot.quantize_rows' blocks (16 bits), rounded by gguf's np_roundf (half away from zero)."""
    from gguf.quants import np_roundf
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(QMAX)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return np_roundf(blocks * inv).astype(np.int32).reshape(m, k), d.reshape(m, k // 32)


def _quantize(wasm, x):
    """x (m, k) quantised by the module: (qx, dx, sx offsets, and the values read back)."""
    m, k = x.shape
    qx, dx, sx = wasm.alloc(m * k * 2), wasm.alloc(m * k // 8), wasm.alloc(m * k // 8)
    for i in range(m):
        wasm("quantize_row", wasm.put(x[i]), k, qx + i * k * 2, dx + i * k // 8, sx + i * k // 8)
    return (qx, dx, sx), (wasm.get(qx, (m, k), np.int16), wasm.get(dx, (m, k // 32), np.float32),
                          wasm.get(sx, (m, k // 32), np.int32))


def test_module_imports_its_memory_and_exports_the_kernels():
    """One import, the memory (JS will own it); every kernel exported, nothing else but __heap_base."""
    import wasmtime
    module = wasmtime.Module.from_file(wasmtime.Engine(), build.build())
    assert [(i.module, i.name, type(i.type).__name__) for i in module.imports] == [("env", "memory", "MemoryType")]
    names = {e.name for e in module.exports}
    expected = {"f16_table", "quantize_row", "f32_matvec", "add_rms_norm", "softmax", "silu", "gelu", "__heap_base",
                "rope", "copy_f32", "cache_attention", "silu_mul", "add_f32", "run", "rope_seq",
                "cache_attention_rows", "add_layer_norm", "argmax_f32", "gemm_f32", "gemm_f16", "gemm_q",
                "conv1d_f32", "softmax_rows", "layer_norm_rows", "f16_to_f32", "f32_to_f16", "rows_f32", "rows_f16",
                "unary_f32", "binary_f32", "reduce_f32", "barrier"}
    expected |= {f"matmul_{q}" for q in FORMATS} | {f"dequant_{q}" for q in FORMATS}
    assert names == expected


def test_build_is_cached_by_source_hash(tmp_path):
    """A second build of the same sources is the same file, untouched; ship() copies it out."""
    first = build.build()
    stamp = os.stat(first).st_mtime_ns
    assert build.build() == first and os.stat(first).st_mtime_ns == stamp
    assert os.path.basename(first) == f"{build.key()}.wasm"
    shipped = build.ship(str(tmp_path / "kernels.wasm"))
    assert open(shipped, "rb").read() == open(first, "rb").read()
    threaded = build.build(threaded=True)
    assert os.path.basename(threaded) == f"{build.key(threaded=True)}-mt.wasm" and threaded != first
    assert open(tmp_path / "kernels_mt.wasm", "rb").read() == open(threaded, "rb").read()


def test_missing_linker_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "linker", lambda: None)
    with pytest.raises(build.ToolchainError, match="apt-get install lld"):
        build.link(b"", [], str(tmp_path / "x.wasm"))


def test_f16_table_is_bit_exact(wasm):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = wasm.get(wasm.table, (65536,), np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN payloads and -0 included


def test_quantize_row_matches_gguf_rounding(wasm):
    """Scales, values and block sums as int_dot.quantize_rows (16 bits): an all-zero block, exact .5
    ties, a value just below a tie."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5
    x[2, 5] = 0.49999997 * float(np.abs(x[2, :32]).max()) / QMAX
    _, (qx, dx, sx) = _quantize(wasm, x)
    qs, d = _activation_reference(x)
    assert np.array_equal(qx, qs)
    assert np.array_equal(dx, d)
    assert np.array_equal(sx, qs.reshape(3, 3, 32).sum(axis=2, dtype=np.int32))


@pytest.mark.parametrize("q", FORMATS)
def test_dequant_is_bit_exact(wasm, q):
    rng = np.random.default_rng(FORMATS.index(q) + 20)
    bs = get_dtype(q).block_size
    raw = _blocks(q, 5, rng)
    out = wasm.alloc(5 * bs * 4)
    wasm(f"dequant_{q}", wasm.put(raw), 5, wasm.table, out)
    want = dequantize_numpy(raw, q, 5 * bs).astype(np.float32)
    assert np.array_equal(wasm.get(out, (5 * bs,), np.float32).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("q", FORMATS)
def test_matmul_matches_dequantised_numpy(wasm, q):
    """One activation row (decode), a tile of 4 and a tile plus a remainder (a prompt); odd row
    counts (the last weight-row pair is a single row); rows of several blocks."""
    rng = np.random.default_rng(FORMATS.index(q))
    bs = get_dtype(q).block_size
    for n, k, m in ((1, bs, 1), (37, 3 * bs, 1), (21, 5 * bs, 4), (6, 2 * bs, 7)):
        raw = _blocks(q, n * k // bs, rng)
        w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
        x = rng.standard_normal((m, k)).astype(np.float32)
        (qx, dx, sx), (qs, d, _) = _quantize(wasm, x)
        out = wasm.alloc(m * n * 4)
        wasm(f"matmul_{q}", wasm.put(raw), n, k // bs, m, qx, dx, sx, wasm.table, out)
        got = wasm.get(out, (m, n), np.float32)
        # against the dequantised activations (the K-quants: their 8-bit requantisation, kquant_reference):
        # float32 rounding only (the block dots are exact integers)
        xq = (qs.reshape(m, k // 32, 32) * d[..., None].astype(np.float64)).reshape(m, k)
        ref_q, bound8 = kquant_product(w, qs, d) if q in K_QUANTS else (xq @ w.T, 0)
        scale = np.abs(xq) @ np.abs(w).T
        assert np.all(np.abs(got - ref_q) <= 2e-5 * scale + 1e-6), (q, n, k, m)
        # against the float activations: each value off by at most half a step, d/2 per block (+ the 8-bit half step)
        bound = (np.abs(w).reshape(n, k // 32, 32).sum(axis=2) @ (d.astype(np.float64) / 2).T).T + bound8
        assert np.all(np.abs(got - x.astype(np.float64) @ w.T) <= bound + 2e-5 * scale + 1e-6), (q, n, k, m)


def test_matmul_matches_native_cpu_kernel(wasm):
    """The same Q4_1 product as the native CPU device's decode kernel (the same IR, another target):
    equal up to float32 summation order."""
    from tallow.backends.cpu.runtime import kernel_calls
    rng = np.random.default_rng(5)
    n, k = 64, 576
    raw = _blocks("q4_1", n * k // 32, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    native = kernel_calls.qmatmul(x, raw, "q4_1", n, k)
    (qx, dx, sx), _ = _quantize(wasm, x)
    out = wasm.alloc(n * 4)
    wasm("matmul_q4_1", wasm.put(raw), n, k // 32, 1, qx, dx, sx, wasm.table, out)
    got = wasm.get(out, (1, n), np.float32)
    w = dequantize_numpy(raw, "q4_1", n * k).reshape(n, k)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)
    assert np.all(np.abs(got - native) <= 1e-5 * scale + 1e-6)


def _close(got, want, rel=1e-5):
    want = np.asarray(want, np.float64)
    assert np.all(np.abs(got - want) <= rel * np.maximum(np.abs(want), 1e-3)), np.abs(got - want).max()


def test_f32_matvec(wasm):
    rng = np.random.default_rng(3)
    for n, k in ((5, 576), (3, 37)):  # a tail of k % 16
        w, x = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
        out = wasm.alloc(n * 4)
        wasm("f32_matvec", wasm.put(w), n, k, wasm.put(x), out)
        got, want = wasm.get(out, (n,), np.float32), w.astype(np.float64) @ x
        assert np.all(np.abs(got - want) <= 1e-5 * (np.abs(w) @ np.abs(x)))


@pytest.mark.parametrize("weighted", [True, False])
def test_add_rms_norm(wasm, weighted):
    """fused_ops.add_rms_norm for one row: total = x + r exactly, normed to 1e-5 (d = 576 and a tail)."""
    rng = np.random.default_rng(4)
    for d in (576, 45):
        x, r, w = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
        total, normed = wasm.alloc(d * 4), wasm.alloc(d * 4)
        wasm("add_rms_norm", wasm.put(x), wasm.put(r), wasm.put(w) if weighted else 0, d, 1e-5, total, normed)
        t = (x + r).astype(np.float64)
        assert np.array_equal(wasm.get(total, (d,), np.float32), x + r)
        want = t / np.sqrt(np.mean(t * t) + 1e-5) * (w if weighted else 1)
        _close(wasm.get(normed, (d,), np.float32), want)


def test_softmax(wasm):
    rng = np.random.default_rng(6)
    for n in (1500, 23, 1):
        x = (rng.standard_normal(n) * 8).astype(np.float32)
        if n > 2:
            x[1] = -np.inf  # a masked key
        at = wasm.put(x)
        wasm("softmax", at, n)
        e = np.exp(x.astype(np.float64) - x.max())
        got = wasm.get(at, (n,), np.float32)
        assert np.all(np.abs(got - e / e.sum()) <= 1e-5 * (e / e.sum()).max() + 1e-12)


def test_silu_and_gelu(wasm):
    rng = np.random.default_rng(7)
    x = np.concatenate([(rng.standard_normal(1000) * 4), [0.0, -30.0, 30.0, -90.0, 90.0]]).astype(np.float32)
    x64 = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    for name, want in (("silu", x64 / (1 + np.exp(-x64))), ("gelu", 0.5 * x64 * (1 + erf(x64 / math.sqrt(2))))):
        out = wasm.alloc(x.size * 4)
        wasm(name, wasm.put(x), x.size, out)
        got = wasm.get(out, (x.size,), np.float32)
        assert np.all(np.abs(got - want) <= 1e-5 * np.abs(want) + 1e-6), (name, np.abs(got - want).max())


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_rotates_each_row_like_torch(wasm, interleaved):
    """Half-split pairs (x[j], x[j + d/2]) or interleaved pairs (x[2j], x[2j + 1]), against torch's
    complex rotation of the same pairs (d = 64: SmolLM2's head size; d = 6: a tail)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    for rows, d in ((12, 64), (3, 6)):
        x = rng.standard_normal((rows, d)).astype(np.float32)
        angle = rng.uniform(-40, 40, d // 2)
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        at = wasm.put(x)
        wasm("rope", at, rows, d, wasm.put(cos), wasm.put(sin), int(interleaved))
        t = torch.from_numpy(x.astype(np.float64))
        pairs = t.reshape(rows, d // 2, 2) if interleaved else t.reshape(rows, 2, d // 2).transpose(1, 2)
        turn = torch.complex(torch.from_numpy(cos).double(), torch.from_numpy(sin).double())
        rotated = torch.view_as_complex(pairs.contiguous()) * turn  # each pair times cos + i sin
        back = torch.view_as_real(rotated)
        want = (back.reshape(rows, d) if interleaved else back.transpose(1, 2).reshape(rows, d)).numpy()
        assert np.abs(wasm.get(at, (rows, d), np.float32) - want).max() <= 1e-5 * np.abs(want).max()


def test_copy_f32_writes_exactly_the_slot(wasm):
    rng = np.random.default_rng(9)
    for n in (192, 37, 1):
        src = rng.standard_normal(n).astype(np.float32)
        dst = wasm.put(np.full(n + 1, 7.0, np.float32))
        wasm("copy_f32", wasm.put(src), n, dst)
        got = wasm.get(dst, (n + 1,), np.float32)
        assert np.array_equal(got[:n], src) and got[n] == 7.0  # nothing past n


@pytest.mark.parametrize("heads, kv_heads, d, keys", [(9, 3, 64, 37), (4, 4, 20, 1), (2, 1, 64, 300)])
def test_cache_attention_matches_torch_sdpa(wasm, heads, kv_heads, d, keys):
    """One query token per head over the first `keys` slots of a cache with more capacity (GQA:
    head h reads kv head h // (heads / kv_heads)), against torch's scaled_dot_product_attention."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    capacity = keys + 5
    q = rng.standard_normal((heads, d)).astype(np.float32)
    kc = rng.standard_normal((kv_heads, capacity, d)).astype(np.float32)
    vc = rng.standard_normal((kv_heads, capacity, d)).astype(np.float32)
    scale = 1 / math.sqrt(d)
    out, scores = wasm.alloc(heads * d * 4), wasm.alloc(keys * 4)
    wasm("cache_attention", wasm.put(q), heads, kv_heads, d, wasm.put(kc), wasm.put(vc), capacity, keys, scale,
         scores, out)
    group = heads // kv_heads
    k = torch.from_numpy(kc[:, :keys]).double().repeat_interleave(group, 0)
    v = torch.from_numpy(vc[:, :keys]).double().repeat_interleave(group, 0)
    want = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q).double()[:, None], k, v, scale=scale)
    _close(wasm.get(out, (heads, d), np.float32), want[:, 0].numpy(), rel=1e-4)


def test_rope_seq_turns_each_token_by_its_own_row(wasm):
    """(heads, t, d): token i's rows by cos/sin row i, against torch's complex rotation."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(14)
    heads, t, d = 3, 5, 8
    x = rng.standard_normal((heads, t, d)).astype(np.float32)
    angle = rng.uniform(-9, 9, (t, d // 2))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    at = wasm.put(x)
    wasm("rope_seq", at, heads, t, d, wasm.put(cos), wasm.put(sin), 0)
    pairs = torch.from_numpy(x).double().reshape(heads, t, 2, d // 2).transpose(2, 3).contiguous()
    turned = torch.view_as_complex(pairs) * torch.complex(torch.from_numpy(cos).double(), torch.from_numpy(sin).double())
    want = torch.view_as_real(turned).transpose(2, 3).reshape(heads, t, d).numpy()
    assert np.abs(wasm.get(at, (heads, t, d), np.float32) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("first", [0, 9])
def test_cache_attention_rows_is_causal_over_the_cache(wasm, first):
    """A prompt's t tokens after `first` cached ones: token i sees slots < first + i + 1, against
    torch's sdpa with that mask (GQA 6 heads over 2)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    heads, kv_heads, t, d, capacity = 6, 2, 4, 32, 20
    q = rng.standard_normal((heads, t, d)).astype(np.float32)
    kc, vc = (rng.standard_normal((kv_heads, capacity, d)).astype(np.float32) for _ in range(2))
    out, scores = wasm.alloc(heads * t * d * 4), wasm.alloc(capacity * 4)
    wasm("cache_attention_rows", wasm.put(q), heads, kv_heads, t, d, wasm.put(kc), wasm.put(vc), capacity, first, 0.2,
         scores, out)
    keys = first + t
    k = torch.from_numpy(kc[:, :keys]).double().repeat_interleave(heads // kv_heads, 0)
    v = torch.from_numpy(vc[:, :keys]).double().repeat_interleave(heads // kv_heads, 0)
    allowed = torch.arange(keys)[None, :] < (first + torch.arange(t)[:, None] + 1)
    want = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q).double(), k, v, attn_mask=allowed,
                                                            scale=0.2)
    _close(wasm.get(out, (heads, t, d), np.float32), want.numpy(), rel=1e-4)


@pytest.mark.parametrize("weighted", [True, False])
def test_add_layer_norm_matches_torch(wasm, weighted):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(16)
    for d in (384, 45):
        x, r, w, bias = (rng.standard_normal(d).astype(np.float32) + 3 for _ in range(4))  # an offset mean
        total, normed = wasm.alloc(d * 4), wasm.alloc(d * 4)
        wasm("add_layer_norm", wasm.put(x), wasm.put(r), wasm.put(w) if weighted else 0,
             wasm.put(bias) if weighted else 0, d, 1e-5, total, normed)
        assert np.array_equal(wasm.get(total, (d,), np.float32), x + r)
        t = torch.from_numpy((x + r).astype(np.float64))
        want = torch.nn.functional.layer_norm(t, (d,), torch.from_numpy(w).double() if weighted else None,
                                              torch.from_numpy(bias).double() if weighted else None, eps=1e-5)
        # float32 rounding of (total - mean), relative to the row's scale (values near 0 have no own scale)
        assert np.abs(wasm.get(normed, (d,), np.float32) - want.numpy()).max() <= 1e-5 * np.abs(want.numpy()).max()


def test_silu_mul_and_add(wasm):
    rng = np.random.default_rng(11)
    for n in (1536, 21):
        g, u = rng.standard_normal(n).astype(np.float32) * 4, rng.standard_normal(n).astype(np.float32)
        out = wasm.alloc(n * 4)
        wasm("silu_mul", wasm.put(g), wasm.put(u), n, out)
        g64 = g.astype(np.float64)
        _close(wasm.get(out, (n,), np.float32), g64 / (1 + np.exp(-g64)) * u)
        wasm("add_f32", wasm.put(g), wasm.put(u), n, out)
        assert np.array_equal(wasm.get(out, (n,), np.float32), g + u)


def test_run_calls_a_program_as_the_separate_calls_would(wasm):
    """A decode layer's tail as one program (norm, gated activation, rope, attention, add), run in
    one call: bit for bit what the same kernels called one by one give."""
    from tallow.backends.wasm.program import encode
    rng = np.random.default_rng(12)
    d, n, heads, hd, keys = 64, 96, 2, 32, 7
    x, r, w = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
    g, u = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    q = rng.standard_normal((heads, hd)).astype(np.float32)
    kc, vc = (rng.standard_normal((1, keys, hd)).astype(np.float32) for _ in range(2))
    cos, sin = rng.standard_normal(hd // 2).astype(np.float32), rng.standard_normal(hd // 2).astype(np.float32)

    def calls():
        at = {name: wasm.put(a) for name, a in dict(x=x, r=r, w=w, g=g, u=u, q=q, kc=kc, vc=vc, cos=cos, sin=sin).items()}
        outs = dict(total=wasm.alloc(d * 4), normed=wasm.alloc(d * 4), act=wasm.alloc(n * 4),
                    att=wasm.alloc(heads * hd * 4), scores=wasm.alloc(keys * 4), sum=wasm.alloc(d * 4))
        return outs, [("add_rms_norm", (at["x"], at["r"], at["w"], d, 1e-6, outs["total"], outs["normed"])),
                      ("silu_mul", (at["g"], at["u"], n, outs["act"])),
                      ("rope", (at["q"], heads, hd, at["cos"], at["sin"], 0)),
                      ("cache_attention", (at["q"], heads, 1, hd, at["kc"], at["vc"], keys, keys, 0.125, outs["scores"],
                                           outs["att"])),
                      ("add_f32", (outs["total"], outs["normed"], d, outs["sum"]))]

    def read(outs):
        return [wasm.get(outs[k], shape, np.float32) for k, shape in
                (("normed", (d,)), ("act", (n,)), ("att", (heads, hd)), ("sum", (d,)))]

    one_by_one, listed = calls()
    for name, args in listed:
        wasm(name, *args)
    want = read(one_by_one)
    outs, listed = calls()
    words, count = encode(listed)
    wasm("run", wasm.put(np.frombuffer(words.tobytes(), np.int32)), count, wasm.put(np.zeros(2, np.int32)))
    for got, ref in zip(read(outs), want):
        assert np.array_equal(got, ref)


def test_step_arguments_let_one_program_serve_every_position(wasm):
    """A KV-slot write, the rotary row and the key count as StepArgs: one program run at positions
    0..3 (the step words rewritten each time) leaves what programs with those values written out
    leave, bit for bit; the token slot picks an embedding row."""
    from tallow.backends.wasm.program import StepArg, encode, step_words
    rng = np.random.default_rng(13)
    heads, d, capacity = 2, 16, 6
    table = rng.standard_normal((5, d)).astype(np.float32)  # "embedding rows"
    cos, sin = (rng.standard_normal((capacity, d // 2)).astype(np.float32) for _ in range(2))

    def setup():
        at = dict(table=wasm.put(table), cos=wasm.put(cos), sin=wasm.put(sin), q=wasm.alloc(heads * d * 4),
                  kc=wasm.put(np.zeros((1, capacity, d), np.float32)), vc=wasm.put(np.zeros((1, capacity, d), np.float32)),
                  scores=wasm.alloc(capacity * 4), out=wasm.alloc(heads * d * 4))
        return at

    def calls(at, pos, token):
        fixed = not isinstance(pos, str)
        row = (lambda base, stride, slot: base + stride * (pos if slot == "position" else token)) if fixed else StepArg
        return [("copy_f32", (row(at["table"], d * 4, "token"), d, at["q"])),
                ("copy_f32", (at["q"] + d * 4 * 0, d, row(at["q"] + d * 4, 0, "position"))),  # stride 0: a fixed word
                ("rope", (at["q"], heads, d, row(at["cos"], d // 2 * 4, "position"), row(at["sin"], d // 2 * 4, "position"), 0)),
                ("copy_f32", (at["q"], d, row(at["kc"], d * 4, "position"))),
                ("copy_f32", (at["q"] + d * 4, d, row(at["vc"], d * 4, "position"))),
                ("cache_attention", (at["q"], heads, 1, d, at["kc"], at["vc"], capacity, row(1, 1, "position"), 0.25,
                                     at["scores"], at["out"]))]

    replayed, written = setup(), setup()
    words, count = encode(calls(replayed, "step", None))
    program, step = wasm.put(np.frombuffer(words.tobytes(), np.int32)), wasm.alloc(8)
    for pos, token in enumerate((3, 1, 4, 1)):
        wasm.memory.write(wasm.store, step_words(pos, token), step)
        wasm("run", program, count, step)
        fixed, n = encode(calls(written, pos, token))
        wasm("run", wasm.put(np.frombuffer(fixed.tobytes(), np.int32)), n, step)
        for name, shape in (("out", (heads, d)), ("kc", (capacity, d)), ("vc", (capacity, d))):
            assert np.array_equal(wasm.get(replayed[name], shape, np.float32), wasm.get(written[name], shape, np.float32))
    assert np.count_nonzero(wasm.get(replayed["kc"], (capacity, d), np.float32).any(axis=1)) == 4  # four slots written


def test_program_encoding_refuses_unknown_kernels_and_wrong_arity():
    from tallow.backends.wasm.program import encode
    from tallow.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="no kernel 'conv2d'"):
        encode([("conv2d", (1, 2))])
    with pytest.raises(UnsupportedError, match="silu takes 3 arguments, got 2"):
        encode([("silu", (1, 2))])
    from tallow.backends.wasm.program import StepArg
    with pytest.raises(UnsupportedError, match="argument 4 of add_rms_norm cannot be StepArg"):
        encode([("add_rms_norm", (1, 2, 3, 4, StepArg(0, 1), 5, 6))])
    with pytest.raises(UnsupportedError, match="cannot be StepArg"):
        encode([("softmax", (StepArg(0, 1, "layer"), 2))])


def test_a_bad_opcode_traps_instead_of_running_on(wasm):
    import wasmtime
    with pytest.raises(wasmtime.Trap):
        wasm("run", wasm.put(np.array([9999, 0, 0, 0], np.int32)), 1, wasm.put(np.zeros(2, np.int32)))


def test_the_program_table_names_every_kernel_but_the_table_and_run():
    """program.OPS (what the host encodes) and the module's exports cannot drift apart."""
    import wasmtime
    from tallow.backends.wasm.program import OPS
    module = wasmtime.Module.from_file(wasmtime.Engine(), build.build())
    exported = {e.name for e in module.exports} - {"__heap_base", "run", "f16_table"}
    assert {name for name, _ in OPS} == exported


def test_web_build_puts_the_module_in_the_site(tmp_path, monkeypatch):
    """`tallow web build` copies the shipped kernels.wasm to the site's root; without one it says so and
    leaves no stale copy."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tallow_web_build_wasm", os.path.join(REPO_ROOT, "web", "build.py"))
    web_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(web_build)
    shipped = build.ship(str(tmp_path / "kernels.wasm"))
    monkeypatch.setattr(web_build, "WASM_KERNELS", shipped)
    site = tmp_path / "site"
    site.mkdir()
    assert web_build.copy_wasm_kernels(str(site)) is True
    assert (site / "kernels.wasm").read_bytes() == open(shipped, "rb").read()
    monkeypatch.setattr(web_build, "WASM_KERNELS", str(tmp_path / "absent.wasm"))
    assert web_build.copy_wasm_kernels(str(site)) is False
    assert not (site / "kernels.wasm").exists()


@pytest.mark.slow
def test_the_wheel_carries_the_module(tmp_path):
    """A wheel built from a checkout where `make wasm` ran holds kernels.wasm as package data, byte for
    byte (users need neither LLVM nor a linker), the threaded kernels_mt.wasm beside it, and driver.js."""
    import sys
    import zipfile
    build.ship()
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "pyodide"))
    try:
        import node_runner
    finally:
        sys.path.pop(0)
    wheel, _ = node_runner.build_wheel(str(tmp_path))
    with zipfile.ZipFile(wheel) as z:
        assert z.read("tallow/backends/wasm/kernels.wasm") == open(build.SHIPPED, "rb").read()
        assert z.read("tallow/backends/wasm/kernels_mt.wasm") == open(build.SHIPPED_THREADED, "rb").read()
        # and the browser driver's JS half (driver_browser.py reads it from the package)
        assert z.read("tallow/backends/wasm/driver.js") == open(os.path.join(os.path.dirname(build.SHIPPED),
                                                                              "driver.js"), "rb").read()
