"""The fused decode ops (issue 13 item 2) on every device, against PyTorch and gguf's codecs:
add_rms_norm, add_layer_norm, linear with its bias, gated_linear (float and GGUF weights),
rope_kv_write, kv_write, attention over a long KV cache (one kernel on wgpu: online softmax
across chunks of keys), cache_attention (append to the KV cache inside attention; split-K on
wgpu, forced onto small caches here), and joining weight rows (cat of quantised rows,
nn.FusedLinear)."""
import numpy as np
import pytest

import tallow
from tallow import functional as F

from storage_io import quantised_activation_error

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

RNG = np.random.default_rng(13)


@pytest.fixture(autouse=True)
def _cpu_kernels_in_use(device):
    """On the cpu device with numba installed, the numpy backend's fused ops are numba kernels once
    the CPU kernels are in use (as after a quantised model's first product): load them, so these
    cases check those kernels (tests/test_cpu_kernels.py checks that they are what runs)."""
    if device.type == "cpu":
        from tallow.backends.cpu.runtime import kernel_calls
        kernel_calls.kernels()


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def T(a, device):
    return tallow.from_numpy(np.ascontiguousarray(a), device=device)


def close(t, ref, tol=1e-5):
    got = t.numpy()
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)


def close_quantised(t, ref, x, w, tol=1e-4, qtype=None):
    """close() for x @ w.T on GGUF weights w (dequantised; qtype their block type), allowing
    activation quantisation."""
    got = t.numpy()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_array_less(np.abs(got - ref), quantised_activation_error(x, w, qtype) + tol * (1 + np.abs(ref)))


def tt(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _rms_norm(x, w, eps):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


# ---- add_rms_norm ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [True, False])
def test_add_rms_norm(device, weight):
    x, r, w = rnd(2, 3, 72), rnd(3, 2, 72), rnd(72)
    wt = T(w, device) if weight else None
    # The residual as a strided view (a transpose), the weight optional.
    total, normed = F.add_rms_norm(T(x, device), T(r, device).transpose(0, 1), wt, 1e-5)
    ref = tt(x) + tt(r).transpose(0, 1)
    close(total, ref.numpy())
    close(normed, _rms_norm(ref, tt(w) if weight else None, 1e-5).numpy(), 1e-4)


def test_add_rms_norm_errors(device):
    x = tallow.ones((2, 8), device=device)
    with pytest.raises(tallow.ShapeError, match="same shape"):
        F.add_rms_norm(x, tallow.ones((8,), device=device))
    with pytest.raises(tallow.ShapeError, match="weight"):
        F.add_rms_norm(x, x, tallow.ones((4,), device=device))


@pytest.mark.parametrize("affine", [True, False])
def test_add_layer_norm(device, affine):
    x, r, w, b = rnd(3, 100), rnd(3, 100) + 4.0, rnd(100), rnd(100)  # an offset mean: centring matters
    wt, bt = (T(w, device), T(b, device)) if affine else (None, None)
    total, normed = F.add_layer_norm(T(x, device), T(r, device), wt, bt, 1e-5)
    ref = tt(x) + tt(r)
    close(total, ref.numpy())
    want = torch.nn.functional.layer_norm(ref, (100,), tt(w) if affine else None, tt(b) if affine else None, 1e-5)
    close(normed, want.numpy(), 1e-4)


def test_add_layer_norm_errors(device):
    x = tallow.ones((2, 8), device=device)
    with pytest.raises(tallow.ShapeError, match="same shape"):
        F.add_layer_norm(x, tallow.ones((2, 4), device=device))
    with pytest.raises(tallow.ShapeError, match="weight/bias"):
        F.add_layer_norm(x, x, None, tallow.ones((4,), device=device))


# ---- linear with a bias -------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 3])
def test_linear_bias_float(device, rows):
    x, w, b = rnd(rows, 64), rnd(37, 64), rnd(37)
    ref = torch.nn.functional.linear(tt(x), tt(w), tt(b)).numpy()
    close(F.linear(T(x, device), T(w, device), T(b, device)), ref, 1e-4)
    # A strided bias (every other element of a longer vector).
    bb = rnd(74)
    ref = torch.nn.functional.linear(tt(x), tt(w), tt(bb[::2])).numpy()
    close(F.linear(T(x, device), T(w, device), T(bb, device)[::2]), ref, 1e-4)


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 70])  # 70: past the GPU's few-rows (matvec) kernel
def test_linear_bias_quantised(device, qtype, rows):
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    x, w, b = rnd(rows, 64), rnd(12, 64), rnd(12)
    blocks = gguf.quants.quantize(w, kind)
    ref = torch.nn.functional.linear(tt(x), tt(gguf.quants.dequantize(blocks, kind)), tt(b)).numpy()
    wq = tallow.from_buffer(blocks.tobytes(), qtype, w.shape, device=device)
    close_quantised(F.linear(T(x, device), wq, T(b, device)), ref, x, gguf.quants.dequantize(blocks, kind))


# ---- gated_linear ------------------------------------------------------------------------------------------
_TORCH_ACTS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.relu,
               "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}


def _gated_ref(x, w, act):
    n = w.shape[0] // 2
    y = tt(x) @ tt(w).T
    return (_TORCH_ACTS[act](y[..., :n]) * y[..., n:]).numpy()


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("rows", [1, 3])
def test_gated_linear_float(device, act, rows):
    x, w = rnd(1, rows, 64), rnd(2 * 36, 64)  # 36 outputs: a partial group of 4 columns on the GPU
    close(F.gated_linear(T(x, device), T(w, device), act), _gated_ref(x, w, act), 1e-4)


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q4_0"])
@pytest.mark.parametrize("rows", [1, 2])
def test_gated_linear_quantised(device, qtype, rows):
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    x, w = rnd(rows, 64), rnd(2 * 10, 64)
    blocks = gguf.quants.quantize(w, kind)
    ref_w = gguf.quants.dequantize(blocks, kind)  # what the kernels must read back
    wq = tallow.from_buffer(blocks.tobytes(), qtype, w.shape, device=device)
    got, ref = F.gated_linear(T(x, device), wq, "silu").numpy(), _gated_ref(x, ref_w, "silu")
    # silu(g) * u with g and u each off by at most xq_error (|silu'| < 1.1).
    y, err = x @ ref_w.T, quantised_activation_error(x, ref_w)
    g, u, eg, eu = y[:, :10], y[:, 10:], err[:, :10], err[:, 10:]
    bound = 1.1 * eg * (np.abs(u) + eu) + np.abs(g) * eu + 1e-4 * (1 + np.abs(ref))
    np.testing.assert_array_less(np.abs(got - ref), bound)


def test_gated_linear_errors(device):
    x = tallow.ones((1, 8), device=device)
    with pytest.raises(tallow.ShapeError, match="2 \\* out"):
        F.gated_linear(x, tallow.ones((3, 8), device=device))
    with pytest.raises(tallow.ShapeError, match="features"):
        F.gated_linear(x, tallow.ones((4, 6), device=device))
    with pytest.raises(tallow.UnsupportedError, match="activation"):
        F.gated_linear(x, tallow.ones((4, 8), device=device), "tanh")


# ---- rope_kv_write ------------------------------------------------------------------------------------------
def _torch_rope(x, cos, sin, interleaved):
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("t", [1, 3])
def test_rope_kv_write(device, interleaved, t):
    h, hk, d, start, cap = 4, 2, 8, 3, 10
    # q, k and v as a decoder gets them: head views of one fused projection's output.
    qkv = rnd(1, t, (h + 2 * hk) * d)
    ang = (start + np.arange(t))[:, None] * (10000 ** (-np.arange(d // 2) / (d // 2)))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    heads = T(qkv, device).reshape(1, t, h + 2 * hk, d)
    q, k, v = (heads.narrow(2, a, n).transpose(1, 2) for a, n in ((0, h), (h, hk), (h + hk, hk)))
    kc, vc = tallow.zeros(1, hk, cap, d, device=device), tallow.zeros(1, hk, cap, d, device=device)
    got = F.rope_kv_write(q, k, v, T(cos, device), T(sin, device), kc.narrow(2, start, t), vc.narrow(2, start, t),
                          interleaved)
    th = tt(qkv).reshape(1, t, h + 2 * hk, d).transpose(1, 2)
    tq, tk, tv = th[:, :h], th[:, h:h + hk], th[:, h + hk:]
    close(got, _torch_rope(tq, tt(cos), tt(sin), interleaved).numpy())
    want_k, want_v = np.zeros((1, hk, cap, d), np.float32), np.zeros((1, hk, cap, d), np.float32)
    want_k[:, :, start:start + t] = _torch_rope(tk, tt(cos), tt(sin), interleaved).numpy()
    want_v[:, :, start:start + t] = tv.numpy()
    close(kc, want_k)
    close(vc, want_v, 0)


def test_rope_kv_write_errors(device):
    q, k = tallow.ones((1, 2, 1, 8), device=device), tallow.ones((1, 1, 1, 8), device=device)
    cs = tallow.ones((1, 4), device=device)
    cache = tallow.zeros(1, 1, 4, 8, device=device)
    with pytest.raises(tallow.ShapeError, match="cache slots"):
        F.rope_kv_write(q, k, k, cs, cs, cache, cache.narrow(2, 0, 1))
    with pytest.raises(tallow.ShapeError, match="cos/sin"):
        F.rope_kv_write(q, k, k, tallow.ones((1, 3), device=device), cs, cache.narrow(2, 0, 1),
                        cache.narrow(2, 0, 1))


def test_kv_write(device):
    hk, t, d, dv, start, cap = 3, 2, 8, 6, 4, 9
    k, v = rnd(1, t, hk, d), rnd(1, hk, t, dv)
    kc, vc = tallow.zeros(1, hk, cap, d, device=device), tallow.zeros(1, hk, cap, dv, device=device)
    # k as a transposed view, as a decoder's head split makes it
    F.kv_write(T(k, device).transpose(1, 2), T(v, device), kc.narrow(2, start, t), vc.narrow(2, start, t))
    want_k, want_v = np.zeros((1, hk, cap, d), np.float32), np.zeros((1, hk, cap, dv), np.float32)
    want_k[:, :, start:start + t] = k.transpose(0, 2, 1, 3)
    want_v[:, :, start:start + t] = v
    close(kc, want_k, 0)
    close(vc, want_v, 0)
    with pytest.raises(tallow.ShapeError, match="cache slots"):
        F.kv_write(T(v, device), T(v, device), kc.narrow(2, 0, t), vc.narrow(2, 0, t))


# ---- attention over a long cache --------------------------------------------------------------------------
@pytest.mark.parametrize("tq,causal,mask", [(1, True, False), (3, True, True), (2, False, True)])
def test_attention_long_cache(device, tq, causal, mask):
    h, hk, tk, d, dv = 4, 2, 600, 64, 80  # 600 keys: three chunks of the one-kernel path
    q, k, v = rnd(1, h, tq, d), rnd(1, hk, tk, d), rnd(1, hk, tk, dv)
    m = rnd(1, h, tq, tk) if mask else None
    kr, vr = tt(k).repeat_interleave(h // hk, 1), tt(v).repeat_interleave(h // hk, 1)
    bias = torch.zeros(tq, tk) if m is None else tt(m)
    if causal:  # the last query sees the last key (a KV cache), not torch's top-left alignment
        bias = bias.masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq), float("-inf"))
    ref = torch.nn.functional.scaled_dot_product_attention(tt(q), kr, vr, attn_mask=bias)
    got = F.scaled_dot_product_attention(T(q, device), T(k, device), T(v, device),
                                         None if m is None else T(m, device), is_causal=causal)
    close(got, ref.numpy(), 1e-4)


# ---- cache_attention ------------------------------------------------------------------------------------------
def _split_k_from(monkeypatch, min_keys, keys_per_split=None):
    """On wgpu: split-K (flash-decoding) from caches of min_keys slots on, keys_per_split each."""
    try:
        from tallow_wgpu import attention
    except ImportError:
        return
    monkeypatch.setattr(attention, "SPLIT_K_MIN_KEYS", min_keys)
    if keys_per_split is not None:
        monkeypatch.setattr(attention, "KEYS_PER_SPLIT", keys_per_split)


@pytest.fixture
def split_k(monkeypatch):
    """Split-K forced onto small caches: from 8 slots on, 4 keys per split."""
    _split_k_from(monkeypatch, 8, 4)


def _cache_attention_case(device, h, hk, t, d, dv, cap, position, rotary=None, key_start=0, window=None,
                          scale=None):
    """cache_attention over a random cache (its slots beyond position + t hold junk it must not read),
    checked against torch: the caches it leaves and its output."""
    kc0, vc0 = rnd(1, hk, cap, d), rnd(1, hk, cap, dv)
    # q, k and v as a decoder gets them: head views of one fused projection's output.
    qkv = rnd(1, t, h * d + hk * (d + dv))
    x = T(qkv, device)
    q = x.narrow(2, 0, h * d).reshape(1, t, h, d).transpose(1, 2)
    k = x.narrow(2, h * d, hk * d).reshape(1, t, hk, d).transpose(1, 2)
    v = x.narrow(2, h * d + hk * d, hk * dv).reshape(1, t, hk, dv).transpose(1, 2)
    tq_, tk_, tv_ = (tt(a) for a in (qkv[..., :h * d], qkv[..., h * d:h * d + hk * d], qkv[..., h * d + hk * d:]))
    tq_, tk_ = tq_.reshape(1, t, h, d).transpose(1, 2), tk_.reshape(1, t, hk, d).transpose(1, 2)
    tv_ = tv_.reshape(1, t, hk, dv).transpose(1, 2)
    cos = sin = None
    if rotary is not None:
        ang = (position + np.arange(t))[:, None] * (10000 ** (-np.arange(d // 2) / (d // 2)))[None]
        c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        cos, sin = T(c, device), T(s, device)
        tq_, tk_ = (_torch_rope(a, tt(c), tt(s), rotary == "interleaved") for a in (tq_, tk_))
    n = position + t - key_start
    mask = None
    allowed = torch.ones(t, n, dtype=torch.bool).tril(n - t)  # query i sees keys up to position + i
    if window is not None:  # ... and none older than its window
        keys = torch.arange(key_start, position + t)[None]
        allowed &= keys > (torch.arange(position, position + t)[:, None] - window)
        mask = T(allowed.numpy(), device)
    kc, vc = T(kc0, device), T(vc0, device)
    got = F.cache_attention(q, k, v, kc, vc, position, cos, sin, rotary == "interleaved", scale, key_start, mask)
    want_k, want_v = tt(kc0.copy()), tt(vc0.copy())
    want_k[:, :, position:position + t], want_v[:, :, position:position + t] = tk_, tv_
    rep = h // hk
    keys = want_k[:, :, key_start:position + t].repeat_interleave(rep, 1)
    values = want_v[:, :, key_start:position + t].repeat_interleave(rep, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(tq_, keys, values, attn_mask=allowed, scale=scale)
    close(kc, want_k.numpy(), 1e-6)
    close(vc, want_v.numpy(), 0)
    close(got, ref.numpy(), 1e-5)
    return got


# Cache lengths (position + 1 keys) around the forced split of 4 keys: 1, 2, split - 1, split,
# split + 1, many splits, and a full cache.
@pytest.mark.parametrize("position", [0, 1, 2, 3, 4, 13, 15])
@pytest.mark.parametrize("rotary", [None, "half", "interleaved"])
def test_cache_attention_one_token(device, split_k, position, rotary):
    # GQA (2 query heads per KV head); values wider than keys when there is no rotary (as a test of dv).
    _cache_attention_case(device, 4, 2, 1, 8, 12 if rotary is None else 8, 16, position, rotary)


@pytest.mark.parametrize("split", [False, True])
def test_cache_attention_long_cache(device, monkeypatch, split):
    """1,100 keys: two 1,024-key chunks of the online softmax in one workgroup, or (as wgpu splits
    a 1,200-slot cache by default) 5 splits of 240."""
    if not split:
        _split_k_from(monkeypatch, 1 << 30)
    _cache_attention_case(device, 2, 1, 1, 16, 16, 1200, 1099, "half")


def test_cache_attention_prompt_and_scale(device):
    """Several new positions at once (a prompt after earlier ones), causal among themselves; Gemma's scale."""
    _cache_attention_case(device, 4, 4, 3, 8, 8, 10, 5, "half", scale=0.3)


@pytest.mark.parametrize("t,position", [(1, 9), (3, 7)])
def test_cache_attention_sliding_window(device, split_k, t, position):
    """A window of 4: keys before the first query's window dropped (key_start), the rest masked per query."""
    window = 4
    key_start = max(0, position + 1 - window)
    _cache_attention_case(device, 4, 2, t, 8, 8, 12, position, "half", key_start=key_start,
                          window=window if t > 1 else None)


def test_cache_attention_errors(device):
    def args(**over):
        a = dict(q=tallow.ones((1, 4, 1, 8), device=device), k=tallow.ones((1, 2, 1, 8), device=device),
                 v=tallow.ones((1, 2, 1, 8), device=device), k_cache=tallow.zeros(1, 2, 4, 8, device=device),
                 v_cache=tallow.zeros(1, 2, 4, 8, device=device), position=1)
        a.update(over)
        return a
    F.cache_attention(**args())  # the valid call the others break one thing of
    bad = [
        (dict(k=tallow.ones((1, 3, 1, 8), device=device)), "do not fit"),   # 4 query heads over 3 KV heads
        (dict(q=tallow.ones((4, 1, 8), device=device)), "must all be"),
        (dict(v_cache=tallow.zeros(1, 2, 5, 8, device=device)), "caches"),
        (dict(position=4), "capacity 4"),
        (dict(position=1, key_start=2), "keys from 2"),
        (dict(cos=tallow.ones((1, 4), device=device)), "both cos and sin"),
        (dict(cos=tallow.ones((1, 3), device=device), sin=tallow.ones((1, 3), device=device)), "cos/sin"),
        (dict(mask=tallow.ones((1, 3), device=device)), "mask"),
    ]
    for over, match in bad:
        with pytest.raises(tallow.ShapeError, match=match):
            F.cache_attention(**args(**over))
    with pytest.raises(tallow.DTypeError, match="one float dtype"):
        F.cache_attention(**args(v_cache=tallow.zeros(1, 2, 4, 8, dtype=tallow.f16, device=device)))


# ---- joined weight rows -----------------------------------------------------------------------------------
def _blocks(w, qtype):
    """w's GGUF blocks (uint8 rows): gguf's quantizer, or tallow's where gguf has none (K-quants)."""
    try:
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype.upper()])
    except NotImplementedError:
        q = tallow.from_numpy(w).to(tallow.get_dtype(qtype))
        return np.frombuffer(q.device.backend.to_bytes(q._storage, q._layout, q.dtype), np.uint8).reshape(len(w), -1)


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q4_0", "q5_0"])  # q5_0: dequantised on upload on wgpu
def test_cat_of_quantised_rows(device, qtype):
    a, b = rnd(3, 64), rnd(5, 64)
    parts = [tallow.from_buffer(_blocks(w, qtype).tobytes(), qtype, w.shape, device=device) for w in (a, b)]
    joined = tallow.cat(parts, 0)
    assert joined.dtype.name == qtype and joined.shape == (8, 64)
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    want = gguf.quants.dequantize(_blocks(np.concatenate([a, b]), qtype), kind)  # rows quantise independently
    close(joined.to(tallow.f32), want, 0)
    with pytest.raises(tallow.UnsupportedError, match="cat of quantised"):
        tallow.cat(parts, 1)


def _fused_linear(source, device, bias):
    from tallow.nn import FusedLinear, VarBuilder
    return FusedLinear(VarBuilder(source, device), ["q", "k", "v"], 64, [8, 4, 4], bias=bias)


def test_fused_linear_joins_rows_and_keeps_missing_biases_zero(device):
    ws = {n: rnd(r, 64) for n, r in (("q", 8), ("k", 4), ("v", 4))}
    bq, bv = rnd(8), rnd(4)
    source = {f"{n}.weight": T(w, device) for n, w in ws.items()}
    source.update({"q.bias": T(bq, device), "v.bias": T(bv, device)})
    layer = _fused_linear(source, device, [True, False, True])
    assert layer.separate is None and layer.weight.shape == (16, 64)
    x = rnd(2, 64)
    q, k, v = layer.parts(T(x, device))
    close(q, x @ ws["q"].T + bq, 1e-4)
    close(k, x @ ws["k"].T, 1e-4)
    close(v, x @ ws["v"].T + bv, 1e-4)


def test_fused_linear_keeps_parts_of_different_block_formats_apart(device):
    ws = {n: rnd(r, 64) for n, r in (("q", 8), ("k", 4), ("v", 4))}
    formats = {"q": "q4_0", "k": "q4_0", "v": "q8_0"}  # as a Q4_K_M file mixes formats
    kinds = {n: gguf.GGMLQuantizationType[f.upper()] for n, f in formats.items()}
    source = {f"{n}.weight": tallow.from_buffer(_blocks(w, formats[n]).tobytes(), formats[n], w.shape, device=device)
              for n, w in ws.items()}
    layer = _fused_linear(source, device, False)
    assert layer.weight is None and len(layer.separate) == 3
    x = rnd(1, 64)
    for got, n in zip(layer.parts(T(x, device)), "qkv"):
        w = gguf.quants.dequantize(_blocks(ws[n], formats[n]), kinds[n])
        close_quantised(got, x @ w.T, x, w)


# ---- add_norm_linear ----------------------------------------------------------------------------------------
def _norm_ref(h, kind, w, b, eps=1e-5):
    if kind == "rms":
        return _rms_norm(h, w, eps)
    return torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps)


# (kind, residual, bias, act, gated): Llama's q/k/v and gate/up, Whisper's q/k/v-or-q and fc1 + gelu,
# a first layer (no residual to add).
_NORM_LINEAR_CASES = {
    "rms-qkv": ("rms", True, False, None, False), "rms-gate-up": ("rms", True, False, "silu", True),
    "layer-fc1-gelu": ("layer", True, True, "gelu", False), "layer-first": ("layer", False, True, None, False),
}


def _add_norm_linear(device, x, r, nw, nb, w, b, kind, act=None, gated=False):
    return F.add_norm_linear(T(x, device), None if r is None else T(r, device), T(nw, device),
                             None if nb is None else T(nb, device), w, None if b is None else T(b, device), kind,
                             1e-5, act, gated)


@pytest.mark.parametrize("case", list(_NORM_LINEAR_CASES))
# One row of 72: wgpu's fused kernel; 3 rows, or rows of 70 (not whole vec4s): the composed default.
@pytest.mark.parametrize("rows,k", [(1, 72), (3, 72), (1, 70)])
def test_add_norm_linear_float(device, case, rows, k):
    kind, res, bias, act, gated = _NORM_LINEAR_CASES[case]
    n = 37  # a partial group of 4 columns on the GPU
    x, r, nw, nb, b = rnd(1, rows, k), rnd(1, rows, k) + 2.0, rnd(k), rnd(k), rnd(n)  # offset mean: centring matters
    w = rnd(2 * n if gated else n, k)
    hidden, y = _add_norm_linear(device, x, r if res else None, nw, nb if kind == "layer" else None, T(w, device),
                                 b if bias else None, kind, act, gated)
    h = tt(x) + tt(r) if res else tt(x)
    normed = _norm_ref(h, kind, tt(nw), tt(nb) if kind == "layer" else None)
    if gated:
        ref = _gated_ref(normed.numpy(), w, act)
    else:
        ref = torch.nn.functional.linear(normed, tt(w), tt(b) if bias else None)
        ref = (_TORCH_ACTS[act](ref) if act else ref).numpy()
    close(hidden, h.numpy())
    close(y, ref, 1e-4)


@pytest.mark.parametrize("qtype,k", [("q4_1", 64), ("q8_0", 64), ("q4_0", 96), ("q4_k", 256)])
@pytest.mark.parametrize("rows", [1, 2])  # one row: wgpu's fused kernel; 2: the composed default
def test_add_norm_linear_quantised(device, qtype, k, rows):
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    n = 12
    x, r, nw, nb, b = rnd(rows, k), rnd(rows, k), rnd(k), rnd(k), rnd(n)
    w, wg = rnd(n, k), rnd(2 * n, k)
    blocks, gblocks = _blocks(w, qtype), _blocks(wg, qtype)
    wq = tallow.from_buffer(blocks.tobytes(), qtype, w.shape, device=device)
    wgq = tallow.from_buffer(gblocks.tobytes(), qtype, wg.shape, device=device)
    # Whisper's layer norm + projection with a bias, against PyTorch on the dequantised weights.
    hidden, y = _add_norm_linear(device, x, r, nw, nb, wq, b, "layer")
    normed = _norm_ref(tt(x) + tt(r), "layer", tt(nw), tt(nb))
    ref_w = gguf.quants.dequantize(blocks, kind)
    close(hidden, (tt(x) + tt(r)).numpy())
    close_quantised(y, torch.nn.functional.linear(normed, tt(ref_w), tt(b)).numpy(), normed.numpy(), ref_w, qtype=qtype)
    # With gelu, and Llama's RMS norm + gated SwiGLU: as this device's ops apart on the same blocks.
    _, y = _add_norm_linear(device, x, r, nw, nb, wq, b, "layer", "gelu")
    _, apart = F.add_layer_norm(T(x, device), T(r, device), T(nw, device), T(nb, device), 1e-5)
    close(y, F.linear(apart, wq, T(b, device)).gelu().numpy(), 1e-5)
    _, y = _add_norm_linear(device, x, r, nw, None, wgq, None, "rms", "silu", gated=True)
    _, apart = F.add_rms_norm(T(x, device), T(r, device), T(nw, device), 1e-5)
    close(y, F.gated_linear(apart, wgq, "silu").numpy(), 1e-5)


@pytest.mark.parametrize("formats", [("q4_0", "q4_0", "q4_0"), ("q4_0", "q4_0", "q8_0")])  # joined, kept apart
def test_fused_linear_add_norm_parts(device, formats):
    """nn.FusedLinear.add_norm_parts: one op when the rows joined, the add and norm apart when not."""
    from tallow.nn import RMSNorm, VarBuilder
    ws = {n: rnd(r, 64) for n, r in (("q", 8), ("k", 4), ("v", 4))}
    source = {f"{n}.weight": tallow.from_buffer(_blocks(w, f).tobytes(), f, w.shape, device=device)
              for (n, w), f in zip(ws.items(), formats)}
    source["norm.weight"] = T(rnd(64), device)
    layer = _fused_linear(source, device, False)
    norm = RMSNorm(VarBuilder(source, device).pp("norm"), 64)
    x, r = T(rnd(1, 64), device), T(rnd(1, 64), device)
    hidden, parts = layer.add_norm_parts(x, r, norm)
    total, normed = F.add_rms_norm(x, r, norm.weight, norm.eps)
    close(hidden, total.numpy(), 0)
    for got, want in zip(parts, layer.parts(normed)):
        close(got, want.numpy(), 1e-5)


def test_add_norm_linear_grad(device):
    """With a gradient to record: the same maths through differentiable ops, gradients as PyTorch's."""
    x, r, nw, w = rnd(1, 32), rnd(1, 32), rnd(32), rnd(10, 32)
    ours = [T(a, device).requires_grad_() for a in (x, r, nw, w)]
    theirs = [tt(a.copy()).requires_grad_() for a in (x, r, nw, w)]
    hidden, y = F.add_norm_linear(*ours[:3], None, ours[3], None, "rms", 1e-5, "silu", gated=True)
    h = theirs[0] + theirs[1]
    g, u = (_rms_norm(h, theirs[2], 1e-5) @ theirs[3].T).split(5, -1)
    ref = torch.nn.functional.silu(g) * u
    close(y, ref.detach().numpy(), 1e-4)
    (y.sum() + hidden.sum()).backward()
    (ref.sum() + h.sum()).backward()
    for o, t in zip(ours, theirs):
        close(o.grad, t.grad.numpy(), 1e-4)


def test_add_norm_linear_errors(device):
    x, w8 = tallow.ones((1, 8), device=device), tallow.ones((8,), device=device)
    w = tallow.ones((6, 8), device=device)
    with pytest.raises(tallow.ShapeError, match="same shape"):
        F.add_norm_linear(x, tallow.ones((2, 8), device=device), w8, None, w)
    with pytest.raises(tallow.ShapeError, match="norm_weight"):
        F.add_norm_linear(x, x, tallow.ones((4,), device=device), None, w)
    with pytest.raises(tallow.ShapeError, match="weight"):
        F.add_norm_linear(x, x, w8, None, tallow.ones((6, 4), device=device))
    with pytest.raises(tallow.ShapeError, match="gate; up"):
        F.add_norm_linear(x, x, w8, None, tallow.ones((5, 8), device=device), act="silu", gated=True)
    with pytest.raises(tallow.ShapeError, match="bias"):
        F.add_norm_linear(x, x, w8, None, w, tallow.ones((4,), device=device))
    with pytest.raises(tallow.UnsupportedError, match="RMS norm has no bias"):
        F.add_norm_linear(x, x, w8, w8, w)
    with pytest.raises(tallow.UnsupportedError, match="norm kind"):
        F.add_norm_linear(x, x, w8, None, w, kind="batch")
    with pytest.raises(tallow.UnsupportedError, match="activation"):
        F.add_norm_linear(x, x, w8, None, w, act="tanh")
    with pytest.raises(tallow.UnsupportedError, match="activation"):
        F.add_norm_linear(x, x, w8, None, w, gated=True)  # a gated projection needs its gate's activation
    with pytest.raises(tallow.UnsupportedError, match="no bias"):
        F.add_norm_linear(x, x, w8, None, w, tallow.ones((6,), device=device), act="silu", gated=True)
