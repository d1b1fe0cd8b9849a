"""scripts/make_synthetic_gguf.py's qwen2 / q4_k_m: llama.cpp's Q4_K_M type mix on
Qwen2.5-0.5B-Instruct's real shape (no file written), and a tiny file of the same
writer that tallow loads and runs (the random blocks checked with the gguf package's
own dequantiser)."""
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_synthetic_gguf as maker  # noqa: E402

sys.path.pop(0)

# llama.cpp's use_more_bits(i, 24): i < 3, i >= 21, or (i - 3) % 3 == 2.
MORE_BITS_LAYERS = {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23}


def _real_plan_types():
    d = maker.shapes("qwen2")
    plan = maker.tensor_plan("qwen2", d)
    return d, plan, {name: maker.tensor_type("q4_k_m", name, shape[1], d, tied=True)
                     for name, shape, quantised in plan if quantised}


def test_qwen2_real_shape():
    d, plan, _ = _real_plan_types()
    assert (d["hidden"], d["heads"], d["kv_heads"], d["head_dim"], d["ff"], d["layers"], d["vocab"]) == \
        (896, 14, 2, 64, 4864, 24, 151936)
    shapes = dict((name, shape) for name, shape, _ in plan)
    assert "output.weight" not in shapes  # tied: the embedding is the output head
    assert shapes["token_embd.weight"] == (151936, 896)
    assert shapes["blk.0.attn_k.weight"] == (128, 896) and shapes["blk.0.attn_k.bias"] == (128,)
    assert shapes["blk.23.ffn_down.weight"] == (896, 4864)


def test_q4_k_m_types_on_the_real_shape():
    """896-wide rows are not whole 256-blocks, so llama.cpp falls back from K-quants there
    (Q4_K -> Q5_0, Q6_K -> Q8_0); only ffn_down (4864 = 19 x 256 wide) keeps Q4_K / Q6_K."""
    _, plan, types = _real_plan_types()
    assert types["token_embd.weight"] == "Q8_0"  # tied output head: Q6_K, fallen back
    for i in range(24):
        more = i in MORE_BITS_LAYERS
        for part in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{part}.weight"] == "Q5_0", (i, part)
        assert types[f"blk.{i}.attn_v.weight"] == ("Q8_0" if more else "Q5_0"), i
        assert types[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if more else "Q4_K"), i
    # The tensor data size, with the gguf package's block sizes.
    data = 0
    for name, shape, quantised in plan:
        if quantised:
            per_block, block_bytes = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, types[name])]
            data += shape[0] * shape[1] // per_block * block_bytes
        else:
            data += shape[0] * 4
    assert 391e6 < data < 393e6


def test_q4_k_m_rule_where_k_quants_fit():
    """4096-wide rows (a Llama-7B-class width): the K-quant types themselves, untied output Q6_K."""
    d = dict(layers=32)
    assert maker.tensor_type("q4_k_m", "output.weight", 4096, d, tied=False) == "Q6_K"
    assert maker.tensor_type("q4_k_m", "token_embd.weight", 4096, d, tied=False) == "Q4_K"
    assert maker.tensor_type("q4_k_m", "blk.0.attn_v.weight", 4096, d, tied=False) == "Q6_K"
    assert maker.tensor_type("q4_k_m", "blk.4.attn_v.weight", 4096, d, tied=False) == "Q4_K"
    assert maker.tensor_type("q4_k_m", "blk.6.ffn_down.weight", 11008, d, tied=False) == "Q6_K"  # (6 - 4) % 3 == 2
    assert maker.tensor_type("q4_k_m", "blk.3.attn_qkv.weight", 4096, d, tied=False) == "Q5_K"
    assert maker.tensor_type("q4_k_m", "blk.3.ffn_up.weight", 4096, d, tied=False) == "Q4_K"
    assert maker.tensor_type("q8_0", "blk.3.ffn_up.weight", 4096, d, tied=False) == "Q8_0"


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_random_blocks_have_the_asked_spread(kind):
    """The gguf package's dequantiser (not ours) reads the blocks as values of about the std asked."""
    rows, cols, std = 8, 512, 0.05
    blocks = maker.random_blocks(np.random.default_rng(1), rows, cols, kind, std)
    values = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind))
    assert values.shape == (rows, cols) and np.isfinite(values).all()
    assert 0.4 * std < values.std() < 2.5 * std
    assert abs(values.mean()) < 0.5 * std


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """A 2-layer, 448-wide, 4748-token qwen2 file with the Q4_K_M mix (3.5 MB)."""
    path = tmp_path_factory.mktemp("qwen2") / "qwen2-tiny.gguf"
    maker.write(path, "qwen2", "q4_k_m", scale=1 / 32, layers=2, seed=5)
    return path


def test_tiny_qwen2_q4_k_m_loads_and_runs(tiny_qwen2):
    tallow = pytest.importorskip("tallow")
    path = tiny_qwen2
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}  # ff = 256: ffn_down keeps K-quants
    model = tallow.load_model(path, device="cpu")
    cfg = model.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers) == (7, 1, 64, 2)
    assert cfg.tie_word_embeddings and cfg.qkv_bias and cfg.rope_theta == 1e6
    tok = model.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    im_start = tok.token_to_id("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 3  # system, user, assistant
    logits = model(ids, last_only=True).numpy().reshape(-1)
    assert logits.shape == (cfg.vocab_size,) and np.isfinite(logits).all() and logits.std() > 0.1


def test_tiny_qwen2_q4_k_m_logits_equal_transformers(tiny_qwen2):
    """transformers' own GGUF loader (the gguf package's dequantisers, its Qwen2 model) reads the
    writer's file, and tallow's logits on the quantised blocks match its f32 ones."""
    tallow = pytest.importorskip("tallow")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(tiny_qwen2), gguf_file=os.path.basename(tiny_qwen2), dtype=torch.float32).eval()
    ids = list(range(300, 340))
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].numpy()
    out = tallow.load_model(tiny_qwen2, device="cpu")(ids).numpy().reshape(len(ids), -1)
    assert ref.std() > 1.0
    # the prompt's 40 rows run on the CPU's integer tiles (cpu int_tiles): 8-bit activations, one scale
    # per 256 values on K-quant matrices and per 32 on the others, as llama.cpp's prompts: max error
    # 10.0% of the logits' std here, llama.cpp 0.3.36's 10.9%; session 36's byte-dot tiles (8 bits per
    # 32 on the K-quants, 16 bits otherwise) 5.1%; through f32 tiles and BLAS it was 7e-6
    np.testing.assert_allclose(out, ref, atol=0.12 * ref.std(), rtol=0)
    assert (out.argmax(-1) == ref.argmax(-1)).all()
