"""Random-weight GGUFs with the real shapes and metadata of Phi-2, Phi-3-mini, Qwen2.5, Llama and Gemma 3.

No Phi weights can be downloaded here, so the big-model path (files over the
browser's 2 GB ArrayBuffer limit, tensors over one GPU binding) is proved on
files like these: the tensor names, shapes, block formats (Q4_0 / Q8_0 for
matrices, f32 for norms and biases) and `phi2.*` / `phi3.*` metadata of
llama.cpp's conversions, including Phi-2's fused attn_qkv, Phi-3's fused
gate/up, a byte-level BPE (Phi-2) or SentencePiece (Phi-3) vocabulary of the
real size and Phi-3's chat template. The vocabularies' merges / pieces are
random (the real ones cannot be downloaded either), so the text is nonsense,
but the tokenizers load and run exactly as real ones do.

Qwen2.5-0.5B-Instruct (`qwen2`: grouped-query attention with q/k/v biases,
tied embeddings, rope theta 1e6, a byte-level BPE of 151936 entries with the
ChatML tokens) is written with llama.cpp's Q4_K_M type mix (`q4_k_m`, see
q4_k_m_type): peak memory depends on shapes, block types and what a runtime
copies, not on the weight values, so this file measures it as the real one
would (bench/llm_memory.py).

    python scripts/make_synthetic_gguf.py phi3 q4_0 phi3-mini-synthetic-q4_0.gguf     # 2.2 GB
    python scripts/make_synthetic_gguf.py phi2 q8_0 tiny.gguf --scale 0.0625 --layers 2
    python scripts/make_synthetic_gguf.py qwen2 q4_k_m qwen2.5-0.5b-synthetic-q4_k_m.gguf  # 0.39 GB
    python scripts/make_synthetic_gguf.py gemma3-270m q4_k_m --cached  # prints $TALLOW_HOME/synthetic/...

Issue 32's K-quant files (bench/llm.py --gguf synthetic:<arch>): Q4_K_M of Qwen2.5-0.5B /
1.5B, SmolLM2-360M and Llama 3.2 1B (Llama architecture), Gemma 3 270M and 1B (262,144-token
vocabulary). The type of each matrix follows llama.cpp's llama_tensor_get_type for Q4_K_M as
of ggml-org/llama.cpp 007dbbf (src/llama-quant.cpp; see q4_k_m_type). --cached writes each full-size
file once into $TALLOW_HOME/synthetic/ and reuses it.

--scale shrinks the width, feed-forward size and vocabulary (heads keep their
real head size); --layers sets the block count. Quantised blocks are drawn
directly (random scales and codes, vectorised numpy), one tensor at a time,
and written as they are made: the whole model is never in memory.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import gguf_files  # noqa: E402  (the one GGUF writer of the tests and scripts)

sys.path.pop(0)

# The real models' shapes (llama.cpp's conversions of microsoft/phi-2, Phi-3-mini-4k-instruct and
# Qwen/Qwen2.5-0.5B-Instruct).
ARCHS = {
    "phi2": dict(hidden=2560, heads=32, kv_heads=32, head_dim=80, ff=10240, layers=32, vocab=51200, context=2048,
                 rope_dims=32, rope_theta=10000.0, name="Phi-2 (synthetic)"),
    "phi3": dict(hidden=3072, heads=32, kv_heads=32, head_dim=96, ff=8192, layers=32, vocab=32064, context=4096,
                 rope_dims=96, rope_theta=10000.0, name="Phi-3-mini-4k-instruct (synthetic)"),
    "qwen2": dict(hidden=896, heads=14, kv_heads=2, head_dim=64, ff=4864, layers=24, vocab=151936, context=32768,
                  rope_dims=64, rope_theta=1000000.0, name="Qwen2.5-0.5B-Instruct (synthetic)"),
    # issue 32's K-quant sizes: the 1.5B Qwen2 (1536-wide rows: every matrix a whole number of
    # 256-blocks, so a Q4_K_M file is all Q4_K / Q6_K), two Llama-architecture models people run
    # (SmolLM2-360M, 960 wide; Llama 3.2 1B, 2048 wide) and Gemma 3 270M / 1B with the
    # 262,144-token vocabulary (head size 256 apart from the width).
    "qwen2-1.5b": dict(hidden=1536, heads=12, kv_heads=2, head_dim=128, ff=8960, layers=28, vocab=151936,
                       context=32768, rope_dims=128, rope_theta=1000000.0, name="Qwen2.5-1.5B-Instruct (synthetic)"),
    "llama-0.5b": dict(hidden=960, heads=15, kv_heads=5, head_dim=64, ff=2560, layers=32, vocab=49152, context=8192,
                       rope_dims=64, rope_theta=100000.0, name="SmolLM2-360M-Instruct (synthetic)"),
    "llama-1.5b": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, ff=8192, layers=16, vocab=128256,
                       context=131072, rope_dims=64, rope_theta=500000.0, name="Llama-3.2-1B-Instruct (synthetic)"),
    "gemma3-270m": dict(hidden=640, heads=4, kv_heads=1, head_dim=256, ff=2048, layers=18, vocab=262144,
                        context=32768, rope_dims=256, rope_theta=1000000.0, window=512,
                        name="gemma-3-270m-it (synthetic)"),
    "gemma3-1b": dict(hidden=1152, heads=4, kv_heads=1, head_dim=256, ff=6912, layers=26, vocab=262144,
                      context=32768, rope_dims=256, rope_theta=1000000.0, window=512, name="gemma-3-1b-it (synthetic)"),
}
# The GGUF general.architecture of each entry (the size variants share their family's).
GGUF_ARCH = {"qwen2-1.5b": "qwen2", "llama-0.5b": "llama", "llama-1.5b": "llama", "gemma3-270m": "gemma3",
             "gemma3-1b": "gemma3"}
QUANTS = ("q4_0", "q8_0", "q4_k_m")  # q4_0 / q8_0: every matrix; q4_k_m: llama.cpp's mix (q4_k_m_type)
# GGML block type -> (values per block, bytes per block, [(byte offset of an f16 scale, role)], spread):
# a block's values have std ~= spread * d, so d = std / spread gives the wanted std. The K-quants'
# 6-bit sub-block scales and mins stay random; dmin = `zero` * d centres them (mean code * mean scale).
BLOCKS = {
    "Q4_0": (32, 18, [(0, "d")], 4.6, 0.0),    # d * (q - 8), q in 0..15
    "Q5_0": (32, 22, [(0, "d")], 9.2, 0.0),    # d * (q - 16), q in 0..31
    "Q8_0": (32, 34, [(0, "d")], 74.0, 0.0),   # d * q, q int8
    "Q4_K": (256, 144, [(0, "d"), (2, "dmin")], 290.0, 7.5),    # d * sc * q - dmin * m, q 0..15, sc/m 0..63
    "Q5_K": (256, 176, [(0, "d"), (2, "dmin")], 590.0, 15.5),   # the same with q 0..31
    "Q6_K": (256, 210, [(208, "d")], 1370.0, 0.0),  # d * scale * (q - 32), scale int8, q 0..63
}
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                  "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                  "<|file_sep|>"]  # ids 151643-151664 in the real vocabulary
QWEN2_PADS = 271  # [PAD151665] ... [PAD151935]: the embedding's unused rows
CHATML_TEMPLATE = (  # the ChatML core of Qwen2.5's template (without its tool-calling branches)
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]


def shapes(arch, scale=1.0, layers=None, vocab=None):
    """The model's dimensions, with width / feed-forward / vocabulary scaled (heads stay whole and
    even, so every matrix row is whole 32-element blocks)."""
    if arch not in ARCHS:
        raise SystemExit(f"unknown architecture {arch!r}: expected one of {', '.join(ARCHS)}")
    if not 0 < scale <= 1:
        raise SystemExit(f"--scale {scale}: expected a number in (0, 1]")
    real = ARCHS[arch]
    if scale == 1:  # the real shape, even where heads * head size is not the width (Gemma 3, SmolLM2's 15 heads)
        d = dict(real, layers=layers or real["layers"])
    else:
        group = real["heads"] // real["kv_heads"]  # query heads per key/value head, kept when scaling
        step = max(2, group)
        heads = max(step, int(round(real["heads"] * scale / step)) * step)
        # Qwen2's feed-forward size stays whole 256-blocks, so a scaled file still has K-quant ffn_down.
        ff_step, ff_min = (256, 256) if arch.startswith(("qwen2", "gemma3", "llama")) else (32, 64)
        hidden = heads * real["head_dim"]
        if gguf_arch(arch) == "gemma3":  # Gemma keeps its 4 heads of 256; the width shrinks on its own
            heads, hidden = real["heads"], max(256, int(real["hidden"] * scale) // 32 * 32)
        d = dict(real, heads=heads, kv_heads=heads // group, hidden=hidden,
                 ff=max(ff_min, int(real["ff"] * scale) // ff_step * ff_step),
                 vocab=max(600, int(real["vocab"] * scale)), layers=layers or real["layers"])
    if vocab is not None:  # (tests: a small vocabulary whatever the width)
        d["vocab"] = vocab
    if d["layers"] < 1:
        raise SystemExit(f"--layers {layers}: expected at least 1")
    return d


def gguf_arch(arch):
    """The GGUF general.architecture of an ARCHS entry."""
    return GGUF_ARCH.get(arch, arch)


def tensor_plan(arch, d):
    """[(name, shape as (rows, cols) or (n,), quantised?)] in llama.cpp's order."""
    n, ff, v = d["hidden"], d["ff"], d["vocab"]
    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    family = gguf_arch(arch)
    plan = [("token_embd.weight", (v, n), True)]
    for i in range(d["layers"]):
        b = f"blk.{i}."
        if family in ("llama", "gemma3"):  # Llama: no biases, SwiGLU; Gemma 3 adds q/k norms and post-norms
            hd = d["head_dim"]
            plan += [(b + "attn_norm.weight", (n,), False), (b + "attn_q.weight", (q, n), True),
                     (b + "attn_k.weight", (kv, n), True), (b + "attn_v.weight", (kv, n), True)]
            if family == "gemma3":
                plan += [(b + "attn_q_norm.weight", (hd,), False), (b + "attn_k_norm.weight", (hd,), False)]
            plan += [(b + "attn_output.weight", (n, q), True)]
            if family == "gemma3":
                plan += [(b + "post_attention_norm.weight", (n,), False)]
            plan += [(b + "ffn_norm.weight", (n,), False), (b + "ffn_gate.weight", (ff, n), True),
                     (b + "ffn_up.weight", (ff, n), True), (b + "ffn_down.weight", (n, ff), True)]
            if family == "gemma3":
                plan += [(b + "post_ffw_norm.weight", (n,), False)]
        elif family == "qwen2":  # grouped-query attention with q/k/v biases, SwiGLU; no output.weight (tied)
            plan += [(b + "attn_norm.weight", (n,), False),
                     (b + "attn_q.weight", (n, n), True), (b + "attn_q.bias", (n,), False),
                     (b + "attn_k.weight", (kv, n), True), (b + "attn_k.bias", (kv,), False),
                     (b + "attn_v.weight", (kv, n), True), (b + "attn_v.bias", (kv,), False),
                     (b + "attn_output.weight", (n, n), True), (b + "ffn_norm.weight", (n,), False),
                     (b + "ffn_gate.weight", (ff, n), True), (b + "ffn_up.weight", (ff, n), True),
                     (b + "ffn_down.weight", (n, ff), True)]
        elif arch == "phi2":  # parallel attention + MLP under one LayerNorm; everything has a bias
            plan += [(b + "attn_norm.weight", (n,), False), (b + "attn_norm.bias", (n,), False),
                     (b + "attn_qkv.weight", (3 * n, n), True), (b + "attn_qkv.bias", (3 * n,), False),
                     (b + "attn_output.weight", (n, n), True), (b + "attn_output.bias", (n,), False),
                     (b + "ffn_up.weight", (ff, n), True), (b + "ffn_up.bias", (ff,), False),
                     (b + "ffn_down.weight", (n, ff), True), (b + "ffn_down.bias", (n,), False)]
        else:
            plan += [(b + "attn_norm.weight", (n,), False), (b + "attn_qkv.weight", (3 * n, n), True),
                     (b + "attn_output.weight", (n, n), True), (b + "ffn_norm.weight", (n,), False),
                     (b + "ffn_up.weight", (2 * ff, n), True), (b + "ffn_down.weight", (n, ff), True)]
    plan += [("output_norm.weight", (n,), False)]
    if arch == "phi2":
        plan += [("output_norm.bias", (n,), False)]
    if family not in ("qwen2", "llama", "gemma3"):  # these tie the output to the embedding
        plan += [("output.weight", (v, n), True)]
    if arch == "phi2":
        plan += [("output.bias", (v,), False)]
    return plan


def _use_more_bits(layer, layers):
    """llama.cpp's choice of the layers whose attn_v / ffn_down get more bits: the first and last
    eighth, and every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(name, cols, layers, tied):
    """The GGML type llama.cpp's llama-quantize gives a matrix in a Q4_K_M file
    (llama_tensor_get_type in src/llama-quant.cpp, for a non-Falcon, non-MoE model):
    - output.weight, or token_embd.weight when it is also the output (tied): Q6_K, or Q8_0
      when its rows are not whole 256-blocks;
    - attn_v and ffn_down: Q6_K in the layers _use_more_bits picks, else Q4_K;
    - a fused attn_qkv: Q5_K; everything else (token_embd untied, attn_q/k/output, ffn_gate/up): Q4_K;
    - then a K-quant whose rows (cols) are not whole 256-blocks falls back: Q4_K -> Q5_0,
      Q5_K -> Q5_1, Q6_K -> Q8_0 (Qwen2.5-0.5B's 896-wide rows do: most of its matrices are Q5_0).
    Norms and biases stay f32 (not asked here)."""
    layer = int(name.split(".")[1]) if name.startswith("blk.") else None
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q8_0" if cols % 256 else "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        chosen = "Q6_K" if _use_more_bits(layer, layers) else "Q4_K"
    elif name.endswith("attn_qkv.weight"):
        chosen = "Q5_K"
    else:
        chosen = "Q4_K"
    if cols % 256:
        chosen = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[chosen]
    return chosen


def tensor_type(quant, name, cols, d, tied):
    """The GGML type of a quantised matrix of the plan."""
    if quant == "q4_k_m":
        return q4_k_m_type(name, cols, d["layers"], tied)
    return quant.upper()


def random_blocks(rng, rows, cols, ggml_type, std):
    """(rows, row_bytes) uint8 of random `ggml_type` blocks whose values have about this std."""
    if ggml_type not in BLOCKS:
        raise SystemExit(f"no random block writer for {ggml_type}: expected one of {', '.join(BLOCKS)}")
    per_block, block_bytes, scales, spread, zero = BLOCKS[ggml_type]
    nblocks = rows * cols // per_block
    data = np.frombuffer(rng.bytes(nblocks * block_bytes), np.uint8).reshape(nblocks, block_bytes).copy()
    d = rng.uniform(0.5, 1.5, nblocks) * (std / spread)
    for at, role in scales:
        value = (d if role == "d" else d * zero).astype(np.float16)
        data[:, at:at + 2] = value.view(np.uint8).reshape(nblocks, 2)
    return data.reshape(rows, -1)


def _random_merges(rng, base, count, sep):
    """`count` new tokens, each two earlier ones joined (short ones preferred), with their merges."""
    tokens, seen, merges = list(base), set(base), []
    while len(merges) < count:
        hi = len(tokens)
        picks = (rng.integers(0, hi) * rng.random() ** 2, rng.integers(0, hi) * rng.random() ** 2)
        a, b = (tokens[int(i)] for i in picks)
        joined = a + b
        if joined in seen or len(joined) > 16:
            continue
        seen.add(joined)
        tokens.append(joined)
        merges.append(a + sep + b)
    return tokens[len(base):], merges


LETTERS = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] \
    + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [str(i) for i in range(10)] + list(".,!?'-:;()\"")


def add_tokenizer(w, arch, vocab, rng):
    family = gguf_arch(arch)
    if family == "qwen2":  # byte-level BPE (Qwen's pre-tokenizer), then the ChatML / tool / FIM tokens, then padding
        from tallow.tokenizer.byte_level import byte_to_char
        byte_chars = byte_to_char()
        first_special = vocab - len(QWEN2_SPECIALS) - QWEN2_PADS
        if first_special < 300:
            raise SystemExit(f"a qwen2 vocabulary of {vocab} entries is too small: it needs at least "
                             f"{300 + len(QWEN2_SPECIALS) + QWEN2_PADS}")
        new, merges = _random_merges(rng, byte_chars, first_special - 256, " ")
        tokens = byte_chars + new + QWEN2_SPECIALS + [f"[PAD{i}]" for i in range(first_special + len(QWEN2_SPECIALS),
                                                                                 vocab)]
        types = [1] * first_special + [3] * len(QWEN2_SPECIALS) + [5] * QWEN2_PADS  # 5: unused
        endoftext, im_end = first_special, first_special + 2
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_eos_token_id(im_end)
        w.add_pad_token_id(endoftext)
        w.add_bos_token_id(endoftext)
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML_TEMPLATE)
        return
    if family in ("phi2", "llama"):  # GPT-2's byte-level BPE; 50256 <|endoftext|> is bos, eos and unk
        # (SmolLM2 and Llama 3 have the same kind of vocabulary, with their own pre-tokenizers)
        from tallow.tokenizer.byte_level import byte_to_char  # GPT-2's byte -> character table
        byte_chars = byte_to_char()
        eos = min(50256, vocab - 1) if family == "phi2" else vocab - 1
        new, merges = _random_merges(rng, byte_chars, eos - 256, " ")
        tokens = byte_chars + new + ["<|endoftext|>"]
        tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
        types = [1] * eos + [3] + [4] * (vocab - eos - 1)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre({"phi2": "phi-2", "llama-0.5b": "smollm"}.get(arch, "llama-bpe"))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(eos)
        w.add_eos_token_id(eos)
        w.add_unk_token_id(eos)
        return
    # Phi-3: Llama's SentencePiece vocabulary (<unk> <s> </s>, 256 byte pieces, scored pieces) + chat tokens
    if family == "gemma3":
        return _add_gemma_tokenizer(w, vocab, rng)
    added = PHI3_ADDED + [f"<|placeholder{i}|>" for i in range(7, 64)]
    n_added = 64  # ids 32000-32063 in the real file
    n_pieces = vocab - 3 - 256 - n_added
    letters = LETTERS
    new, _ = _random_merges(rng, letters, n_pieces - len(letters), "")
    pieces = letters + new
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + added[:n_added]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3] * n_added
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0] * n_added
    eos = 259 + len(pieces)  # <|endoftext|>
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_pad_token_id(eos)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_eot_token_id(eos + PHI3_ADDED.index("<|end|>"))
    w.add_chat_template(PHI3_CHAT_TEMPLATE)


def _add_gemma_tokenizer(w, vocab, rng):
    """Gemma 3's SentencePiece layout: <pad> <eos> <bos> <unk>, the turn markers, 256 byte
    pieces, then scored pieces (random here) up to the 262,144 entries."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    n_pieces = vocab - len(specials) - 256
    new, _ = _random_merges(rng, LETTERS, n_pieces - len(LETTERS), "")
    pieces = LETTERS + new
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_token_scores([0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_eot_token_id(5)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def write(path, arch, quant, scale=1.0, layers=None, seed=0, log=None, vocab=None):
    """Write the synthetic GGUF; returns its size in bytes. vocab: the vocabulary's size instead
    of the (scaled) real one."""
    import gguf
    if quant not in QUANTS:
        raise SystemExit(f"unknown quantisation {quant!r}: expected one of {', '.join(QUANTS)}")
    d = shapes(arch, scale, layers, vocab)
    rng = np.random.default_rng(seed)

    def metadata(w):
        real = scale == 1 and layers in (None, d["layers"]) and vocab in (None, ARCHS[arch]["vocab"])
        w.add_name(d["name"] if real else f"{d['name']}, scaled")
        w.add_file_type({"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                         "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}[quant])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(d["context"])
        w.add_embedding_length(d["hidden"])
        w.add_feed_forward_length(d["ff"])
        w.add_block_count(d["layers"])
        w.add_head_count(d["heads"])
        w.add_head_count_kv(d["kv_heads"])
        family = gguf_arch(arch)
        if family not in ("qwen2", "gemma3"):  # llama.cpp writes none for these (the whole head rotates)
            w.add_rope_dimension_count(d["rope_dims"])
        w.add_rope_freq_base(d["rope_theta"])
        if family == "phi2":
            w.add_layer_norm_eps(1e-5)
        elif family == "qwen2":
            w.add_layer_norm_rms_eps(1e-6)
        elif family == "llama":
            w.add_layer_norm_rms_eps(1e-5)
        elif family == "gemma3":
            w.add_layer_norm_rms_eps(1e-6)
            w.add_key_length(d["head_dim"])
            w.add_value_length(d["head_dim"])
            w.add_sliding_window(d["window"])
        else:
            w.add_layer_norm_rms_eps(1e-5)
            w.add_sliding_window(2047)
        add_tokenizer(w, arch, d["vocab"], rng)
    plan = tensor_plan(arch, d)
    tied = not any(name == "output.weight" for name, _, _ in plan)
    types = {name: tensor_type(quant, name, shape[1], d, tied) if quantised else "F32"
             for name, shape, quantised in plan}
    for ggml_type in set(types.values()) - {"F32"}:
        if ggml_type not in BLOCKS:
            raise SystemExit(f"no random block writer for {ggml_type}: expected one of {', '.join(BLOCKS)}")

    def tensors():  # made one at a time, after the header is written
        started = time.perf_counter()
        for i, (name, shape, quantised) in enumerate(plan):
            if quantised:
                # Embedding rows are small (std 0.5); a matrix's outputs keep about the input's scale.
                std = 0.5 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[1])
                yield random_blocks(rng, shape[0], shape[1], types[name], std)
            elif name.endswith("norm.weight"):
                yield rng.uniform(0.8, 1.2, shape).astype(np.float32)
            else:  # biases
                yield rng.normal(0.0, 0.02, shape).astype(np.float32)
            if log and (i % 50 == 0 or i == len(plan) - 1):
                log(f"{i + 1}/{len(plan)} tensors, {time.perf_counter() - started:.1f} s")
    return gguf_files.write_streamed(path, gguf_arch(arch), metadata,
                                     [(name, shape, types[name]) for name, shape, _ in plan], tensors())


def cache_dir():
    home = os.environ.get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")
    return os.path.join(home, "synthetic")


def cached(arch, quant="q4_k_m", log=None):
    """The path of the full-size synthetic file $TALLOW_HOME/synthetic/<arch>-<quant>.gguf,
    written first if it is not there yet (to a temporary name, renamed when complete, so an
    interrupted run never leaves a truncated file behind)."""
    shapes(arch)  # the unknown-architecture error before any folder is made
    path = os.path.join(cache_dir(), f"{arch}-{quant}.gguf")
    if not os.path.exists(path):
        os.makedirs(cache_dir(), exist_ok=True)
        part = f"{path}.{os.getpid()}.part"
        try:
            write(part, arch, quant, log=log)
            os.replace(part, path)
        finally:
            if os.path.exists(part):
                os.remove(part)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arch", choices=sorted(ARCHS))
    p.add_argument("quant", choices=QUANTS)
    p.add_argument("out", nargs="?", help="the file to write (default: the cached one, see --cached)")
    p.add_argument("--cached", action="store_true",
                   help="print the path of $TALLOW_HOME/synthetic/<arch>-<quant>.gguf, making it first if missing")
    p.add_argument("--scale", type=float, default=1.0, help="shrink width, feed-forward and vocabulary (0, 1]")
    p.add_argument("--layers", type=int, default=None, help="number of blocks (default: the real model's)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.cached or a.out is None:
        if a.scale != 1 or a.layers is not None or a.seed:
            p.error("--cached files are the full-size ones: give an output path with --scale/--layers/--seed")
        print(cached(a.arch, a.quant, log=lambda m: print(m, file=sys.stderr)))
        return
    started = time.perf_counter()
    size = write(a.out, a.arch, a.quant, a.scale, a.layers, a.seed, log=lambda m: print(m, file=sys.stderr))
    print(f"{a.out}: {size / 1e9:.3f} GB in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
