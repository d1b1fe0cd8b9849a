"""Gemma 3, Qwen3, Llama 3.2 (llama3 rope as GGUF rope_freqs) and Phi-2 GGUF against transformers.

As in test_llm_models.py: transformers builds each architecture with random
weights from a tiny config with the switches the real checkpoints use, saves it
as a Hugging Face folder and (here) as a GGUF written the way llama.cpp's
convert_hf_to_gguf.py writes it, with the gguf package's own tensor-name map.
tallow must give transformers' logits (1e-4) for a prefill and 8 KV-cache steps,
so the greedy tokens are equal too. Norm weights are randomised (transformers
initialises them to 0 or 1), so a missing +1 or a skipped q/k norm shows.
"""
import json
import math

import numpy as np
import pytest

import tallow
from tallow.errors import FormatError, UnsupportedError
from tallow.generation import generate_ids

import gguf_files

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

PROMPT = [3, 17, 99, 5, 200, 31, 7]
STEPS = 8
WINDOW = 4  # Gemma 3's sliding window: shorter than prompt + steps, so it matters

LLAMA32_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


def _hf(kind, tmp_path, seed=0, attn=None, **overrides):
    """A random transformers model of a tiny config of the real architecture, saved to tmp_path/kind."""
    torch.manual_seed(seed)
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1)
    base.update(overrides)
    config_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "phi": (tf.PhiConfig, tf.PhiForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
    }[kind]
    config = config_cls(**base)
    if attn:
        config._attn_implementation = attn
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if kind == "gemma3" else 1.0))
    path = tmp_path / kind
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def _reference(model, prompt=PROMPT, steps=STEPS):
    """transformers' logits for the prefill, then each greedy step through its own cache."""
    logits, fed = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        logits.append(out.logits[0].numpy())
        for _ in range(steps):
            fed.append(int(out.logits[0, -1].argmax()))
            cache = getattr(out, "cache", None) or out.past_key_values
            out = model(torch.tensor([[fed[-1]]]), cache=cache, use_cache=True)
            logits.append(out.logits[0].numpy())
    return logits, fed


def _check(model, path, tol=1e-4, device="cpu", steps=STEPS):
    ref, fed = _reference(model, steps=steps)
    ours = tallow.load_model(path, device=device)
    got = [ours(PROMPT)] + [ours([t]) for t in fed]
    for i, (r, g) in enumerate(zip(ref, got)):
        g = g.numpy()[0]
        assert g.shape == r.shape, (i, g.shape, r.shape)
        assert np.abs(g - r).max() <= tol, f"step {i}: max |diff| {np.abs(g - r).max():.3g} > {tol}"
    assert float(np.abs(ref[0]).max()) > 0.5  # not a comparison of near-zero logits
    # greedy decoding through tallow's generate picks transformers' tokens
    ours.reset()
    assert list(generate_ids(ours, PROMPT, max_tokens=steps, stop_tokens=[])) == fed
    return ours


# ---- GGUF as llama.cpp's convert_hf_to_gguf.py writes it -------------------------------------------

def _llama3_rope_freqs(cfg):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: the rope_freqs divisors of llama3 scaling."""
    rope = cfg.rope_parameters
    base, dim = rope["rope_theta"], cfg.head_dim
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def _write_gguf(model, path, arch, fuse_qkv=False, q8_0=False, eot=None):
    cfg = model.config
    tensors = {n: w.detach().numpy().astype(np.float32) for n, w in model.state_dict().items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    if arch == "gemma3":
        for n in tensors:  # Gemma3Model.modify_tensors: the norms carry HF's run-time +1
            if n.endswith("norm.weight"):
                tensors[n] = tensors[n] + 1
    if getattr(cfg, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)

    def metadata(w):
        gguf_files.add_hparams(w, cfg, rope["rope_theta"])
        w.add_eos_token_id(cfg.eos_token_id)
        if eot is not None:
            w.add_eot_token_id(eot)
        if arch == "phi2":
            w.add_layer_norm_eps(cfg.layer_norm_eps)
            w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * head_dim))
        else:
            w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        if arch == "llama":
            w.add_rope_dimension_count(head_dim)
            w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(cfg))
        if arch == "gemma3":
            w.add_sliding_window(cfg.sliding_window)
            if rope.get("rope_type") == "linear":
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
                w.add_rope_scaling_factor(rope["factor"])
        if fuse_qkv:  # phi-2 as converted from Microsoft's original checkpoint (one Wqkv per block), kept f32
            for i in range(cfg.num_hidden_layers):
                for kind in ("weight", "bias"):
                    parts = [tensors.pop(f"model.layers.{i}.self_attn.{p}_proj.{kind}") for p in "qkv"]
                    w.add_tensor(f"blk.{i}.attn_qkv.{kind}", np.concatenate(parts, 0))
    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)

    def renamed():  # after metadata(): the fused q/k/v are popped there
        for n, t in tensors.items():
            if arch == "llama" and n.endswith("q_proj.weight"):
                t = gguf_files.llama_permute(t, cfg.num_attention_heads)
            elif arch == "llama" and n.endswith("k_proj.weight"):
                t = gguf_files.llama_permute(t, cfg.num_key_value_heads)
            yield names.get_name(n, try_suffixes=(".weight", ".bias")), t
    # llama.cpp keeps 1-D norms and biases in f32
    return gguf_files.write(path, arch, metadata, renamed(), qtype="q8_0" if q8_0 else None)


# ---- Gemma 3 ----------------------------------------------------------------------------------------

def _gemma3(tmp_path, **overrides):
    # Gemma 3 1B's shape in miniature: 4 query heads on 1 KV head, head_dim independent of the width.
    base = dict(num_hidden_layers=6, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh")
    return _hf("gemma3", tmp_path, **{**base, **overrides})


@pytest.mark.parametrize("overrides", [
    dict(),                                                                  # 270M / 1B: 5 sliding + 1 global
    dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
         query_pre_attn_scalar=24, rope_parameters=GEMMA3_ROPE),              # 4B+: linear x8 on global layers
], ids=["pattern6", "layer_types-linear-scalar"])
def test_gemma3_matches_transformers(tmp_path, overrides):
    model, path = _gemma3(tmp_path, **overrides)
    ours = _check(model, path)
    assert ours.config.layer_types == model.config.layer_types
    assert {ours.config.window(t) for t in ours.config.layer_types} == {WINDOW, None}


def test_gemma3_final_softcapping_matches_transformers(tmp_path):
    """A tanh soft cap on the final logits. An attention-score cap is refused: transformers'
    Gemma 3 never applies it (its attention gets no softcap) and llama.cpp's converter rejects it."""
    model, path = _gemma3(tmp_path, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                          final_logit_softcapping=3.0)
    ours = _check(model, path)
    assert float(np.abs(ours(PROMPT).numpy()).max()) < 3.0
    raw = json.loads((path / "config.json").read_text())
    raw["attn_logit_softcapping"] = 50.0
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedError, match="attn_logit_softcapping"):
        tallow.load_model(path, device="cpu")


def test_gemma3_on_the_python_device(tmp_path):
    """The pure-Python backend (the browser's fallback) runs Gemma 3 too: kept tiny, it is slow."""
    model, path = _gemma3(tmp_path, num_hidden_layers=2, hidden_size=32, intermediate_size=48, head_dim=16,
                          num_attention_heads=2, query_pre_attn_scalar=16,
                          layer_types=["sliding_attention", "full_attention"])
    ours = _check(model, path, device="python", steps=3)
    assert ours.device.type == "python"


def test_gemma3_hub_style_config(tmp_path):
    """Checkpoints on the Hub spell the settings the older way: rope_theta, rope_local_base_freq,
    rope_scaling for global layers, sliding_window_pattern, no layer_types."""
    model, path = _gemma3(tmp_path, rope_parameters=GEMMA3_ROPE)
    raw = json.loads((path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        raw.pop(key)
    raw.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=6,
               rope_scaling={"rope_type": "linear", "factor": 8.0})
    (path / "config.json").write_text(json.dumps(raw))
    _check(model, path)


def test_gemma3_gguf_matches_transformers(tmp_path):
    """llama.cpp's gemma3 GGUF: norms with +1 baked in, every 6th layer global, sliding base 10000,
    query_pre_attn_scalar = head_dim, linear scaling on global layers, tied output."""
    model, _ = _gemma3(tmp_path, rope_parameters=GEMMA3_ROPE)
    ours = _check(model, _write_gguf(model, tmp_path / "gemma3.gguf", "gemma3", eot=250))
    assert ours.config.layer_types == model.config.layer_types and ours.config.sliding_window == WINDOW
    assert ours.eos_token_ids == [model.config.eos_token_id, 250]  # <eos> and <end_of_turn> both end a reply


def test_gemma3_q8_0_gguf_matches_transformers_on_the_same_file(tmp_path, monkeypatch):
    """transformers' own GGUF loader (it subtracts the 1 from the norms) reading the same Q8_0 file
    agrees with tallow, quantised embedding table included. transformers takes query_pre_attn_scalar
    from its default (256) where llama.cpp uses head_dim, so head_dim is 256 here, as in Gemma 3 1B.
    With f32 copies of the weights: the CPU's numba kernels quantise activations per block as ggml
    does (their error is bounded in tests/test_cpu_kernels.py); this test is about reading the file."""
    monkeypatch.setenv("TALLOW_QUANT_CACHE_MB", "64")
    pytest.importorskip("accelerate")  # transformers needs it to read GGUF
    model, _ = _gemma3(tmp_path, head_dim=256, query_pre_attn_scalar=256)
    path = _write_gguf(model, tmp_path / "gemma3-q8_0.gguf", "gemma3", q8_0=True)
    ref = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    assert ref.config.layer_types == model.config.layer_types
    ours = _check(ref, path)
    assert not ours.embed_tokens.weight.dtype.is_float  # the table stayed quantised


@pytest.mark.parametrize("edit,match", [
    ({"layer_types": ["sliding_attention"]}, "layer_types"),                      # one entry for two layers
    ({"layer_types": ["sliding_attention", "local"]}, "layer_types"),
    ({"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar"),
    ({"final_logit_softcapping": "30"}, "final_logit_softcapping"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 0}}},
     r"rope_parameters\.sliding_attention\.rope_theta"),
    ({"rope_parameters": {"full_attention": [], "sliding_attention": {}}}, r"rope_parameters\.full_attention"),
])
def test_gemma3_bad_config_values_are_named(tmp_path, edit, match):
    _, path = _gemma3(tmp_path, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    raw = json.loads((path / "config.json").read_text())
    raw.update(edit)
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(FormatError, match=match):
        tallow.load_model(path, device="cpu")


def test_gemma3_multimodal_config_is_refused_with_a_hint(tmp_path):
    _, path = _gemma3(tmp_path, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    raw = json.loads((path / "config.json").read_text())
    raw["model_type"] = "gemma3"  # Gemma3ForConditionalGeneration's config
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedError, match="gemma3_text"):
        tallow.load_model(path, device="cpu")


def test_gemma3_gguf_bad_sliding_window_pattern_is_named(tmp_path):
    from tallow.io.gguf import write_gguf
    model, _ = _gemma3(tmp_path, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    src = tallow.io.open(_write_gguf(model, tmp_path / "gemma3.gguf", "gemma3"))
    meta, types = dict(src.metadata), dict(src.metadata_types)
    for bad in ([True], 0):  # one flag for two blocks; a pattern of 0
        meta["gemma3.attention.sliding_window_pattern"] = bad
        types.pop("gemma3.attention.sliding_window_pattern", None)
        out = tmp_path / "bad.gguf"
        write_gguf(out, {n: src.tensor(n, "cpu") for n in src.keys()}, meta, metadata_types=types)
        with pytest.raises(FormatError, match="sliding_window_pattern"):
            tallow.load_model(out, device="cpu")


# ---- Qwen3 ------------------------------------------------------------------------------------------

def _qwen3(tmp_path):
    # Qwen3-0.6B in miniature: head_dim (32) set apart from hidden / heads (16), tied, q/k norms, no biases.
    return _hf("qwen3", tmp_path, head_dim=32, tie_word_embeddings=True,
               rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


def test_qwen3_matches_transformers(tmp_path):
    model, path = _qwen3(tmp_path)
    ours = _check(model, path)
    assert ours.layers[0].self_attn.qkv_proj.bias is None and ours.config.qk_norm


def test_qwen3_gguf_matches_transformers(tmp_path):
    model, _ = _qwen3(tmp_path)
    ours = _check(model, _write_gguf(model, tmp_path / "qwen3.gguf", "qwen3"))
    assert ours.config.head_dim == 32 and not ours.config.rope_interleaved


# ---- Llama 3.2 --------------------------------------------------------------------------------------

def test_llama32_gguf_rope_freqs_matches_transformers(tmp_path):
    """Llama 3.2 1B in miniature (GQA, tied, llama3 rope scaling) as llama.cpp writes it: permuted
    q/k rows and the scaling stored as the rope_freqs tensor of per-frequency divisors."""
    model, path = _hf("llama", tmp_path, tie_word_embeddings=True, rope_parameters=LLAMA32_ROPE)
    _check(model, path)
    freqs = _llama3_rope_freqs(model.config)
    assert freqs.min() == 1.0 and freqs.max() == 32.0 and len(set(freqs.tolist())) > 2  # all three regimes
    ours = _check(model, _write_gguf(model, tmp_path / "llama32.gguf", "llama"))
    assert ours.config.rope_scaling["rope_type"] == "freq_factors" and ours.config.rope_interleaved


# ---- Phi-2 GGUF -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fuse_qkv", [False, True], ids=["q-k-v", "fused-qkv"])
def test_phi2_gguf_matches_transformers(tmp_path, fuse_qkv):
    """Phi-2 in miniature (partial rotary 0.4, biases everywhere, untied output with a bias)."""
    model, _ = _hf("phi", tmp_path, hidden_size=80, num_key_value_heads=4, partial_rotary_factor=0.4)
    ours = _check(model, _write_gguf(model, tmp_path / "phi2.gguf", "phi2", fuse_qkv=fuse_qkv))
    assert ours.config.rotary_dim == 8 and ours.lm_head_bias is not None
