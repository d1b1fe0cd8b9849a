"""Random-weight GGUFs with the real shapes and metadata of Phi-2 and Phi-3-mini.

No Phi weights can be downloaded here, so the big-model path (files over the
browser's 2 GB ArrayBuffer limit, tensors over one GPU binding) is proved on
files like these: the tensor names, shapes, block formats (Q4_0 / Q8_0 for
matrices, f32 for norms and biases) and `phi2.*` / `phi3.*` metadata of
llama.cpp's conversions, including Phi-2's fused attn_qkv, Phi-3's fused
gate/up, a byte-level BPE (Phi-2) or SentencePiece (Phi-3) vocabulary of the
real size and Phi-3's chat template. The vocabularies' merges / pieces are
random (the real ones cannot be downloaded either), so the text is nonsense,
but the tokenizers load and run exactly as real ones do.

    python scripts/make_synthetic_gguf.py phi3 q4_0 phi3-mini-synthetic-q4_0.gguf     # 2.2 GB
    python scripts/make_synthetic_gguf.py phi2 q8_0 tiny.gguf --scale 0.0625 --layers 2

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

# The real models' shapes (llama.cpp's conversions of microsoft/phi-2 and Phi-3-mini-4k-instruct).
ARCHS = {
    "phi2": dict(hidden=2560, heads=32, head_dim=80, ff=10240, layers=32, vocab=51200, context=2048,
                 rope_dims=32, name="Phi-2 (synthetic)"),
    "phi3": dict(hidden=3072, heads=32, head_dim=96, ff=8192, layers=32, vocab=32064, context=4096,
                 rope_dims=96, name="Phi-3-mini-4k-instruct (synthetic)"),
}
QUANTS = {"q4_0": (18, 2, "Q4_0"), "q8_0": (34, 2, "Q8_0")}  # block bytes, scale bytes, GGML name
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]


def shapes(arch, scale=1.0, layers=None):
    """The model's dimensions, with width / feed-forward / vocabulary scaled (heads stay whole and
    even, so every matrix row is whole 32-element blocks)."""
    if arch not in ARCHS:
        raise SystemExit(f"unknown architecture {arch!r}: expected one of {', '.join(ARCHS)}")
    if not 0 < scale <= 1:
        raise SystemExit(f"--scale {scale}: expected a number in (0, 1]")
    real = ARCHS[arch]
    heads = max(2, int(round(real["heads"] * scale / 2)) * 2)
    d = dict(real, heads=heads, hidden=heads * real["head_dim"],
             ff=max(64, int(real["ff"] * scale) // 32 * 32),
             vocab=max(600, int(real["vocab"] * scale)), layers=layers or real["layers"])
    if d["layers"] < 1:
        raise SystemExit(f"--layers {layers}: expected at least 1")
    return d


def tensor_plan(arch, d):
    """[(name, shape as (rows, cols) or (n,), quantised?)] in llama.cpp's order."""
    n, ff, v = d["hidden"], d["ff"], d["vocab"]
    plan = [("token_embd.weight", (v, n), True)]
    for i in range(d["layers"]):
        b = f"blk.{i}."
        if arch == "phi2":  # parallel attention + MLP under one LayerNorm; everything has a bias
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
    plan += [("output.weight", (v, n), True)]
    if arch == "phi2":
        plan += [("output.bias", (v,), False)]
    return plan


def random_blocks(rng, rows, cols, quant, std):
    """(rows, row_bytes) uint8 of random `quant` blocks whose values have about this std."""
    block_bytes, scale_bytes, _ = QUANTS[quant]
    nblocks = rows * cols // 32
    data = np.frombuffer(rng.bytes(nblocks * block_bytes), np.uint8).reshape(nblocks, block_bytes).copy()
    # Q4_0 codes are nibbles (value d * (q - 8), std 4.6 d); Q8_0 codes are int8 (std 74 d).
    spread = 4.6 if quant == "q4_0" else 74.0
    scales = (rng.uniform(0.5, 1.5, nblocks) * (std / spread)).astype(np.float16)
    data[:, :scale_bytes] = scales.view(np.uint8).reshape(nblocks, 2)
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


def add_tokenizer(w, arch, vocab, rng):
    if arch == "phi2":  # GPT-2's byte-level BPE; 50256 <|endoftext|> is bos, eos and unk
        from tallow.tokenizer.byte_level import byte_to_char  # GPT-2's byte -> character table
        byte_chars = byte_to_char()
        eos = min(50256, vocab - 1)
        new, merges = _random_merges(rng, byte_chars, eos - 256, " ")
        tokens = byte_chars + new + ["<|endoftext|>"]
        tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
        types = [1] * eos + [3] + [4] * (vocab - eos - 1)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("phi-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(eos)
        w.add_eos_token_id(eos)
        w.add_unk_token_id(eos)
        return
    # Phi-3: Llama's SentencePiece vocabulary (<unk> <s> </s>, 256 byte pieces, scored pieces) + chat tokens
    sp = "\u2581"
    added = PHI3_ADDED + [f"<|placeholder{i}|>" for i in range(7, 64)]
    n_added = 64  # ids 32000-32063 in the real file
    n_pieces = vocab - 3 - 256 - n_added
    letters = [sp] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] \
        + [str(i) for i in range(10)] + list(".,!?'-:;()\"")
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


def write(path, arch, quant, scale=1.0, layers=None, seed=0, log=None):
    """Write the synthetic GGUF; returns its size in bytes."""
    import gguf
    if quant not in QUANTS:
        raise SystemExit(f"unknown quantisation {quant!r}: expected one of {', '.join(QUANTS)}")
    d = shapes(arch, scale, layers)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name(d["name"] if scale == 1 and layers in (None, d["layers"]) else f"{d['name']}, scaled")
    w.add_file_type({"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[quant])
    w.add_context_length(d["context"])
    w.add_embedding_length(d["hidden"])
    w.add_feed_forward_length(d["ff"])
    w.add_block_count(d["layers"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["heads"])
    w.add_rope_dimension_count(d["rope_dims"])
    w.add_rope_freq_base(10000.0)
    if arch == "phi2":
        w.add_layer_norm_eps(1e-5)
    else:
        w.add_layer_norm_rms_eps(1e-5)
        w.add_sliding_window(2047)
    add_tokenizer(w, arch, d["vocab"], rng)
    plan = tensor_plan(arch, d)
    qtype = getattr(gguf.GGMLQuantizationType, QUANTS[quant][2])
    block_bytes = QUANTS[quant][0]
    for name, shape, quantised in plan:
        if quantised:
            rows, cols = shape
            w.add_tensor_info(name, (rows, cols // 32 * block_bytes), np.dtype(np.uint8),
                              rows * cols // 32 * block_bytes, raw_dtype=qtype)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    started = time.perf_counter()
    for i, (name, shape, quantised) in enumerate(plan):
        if quantised:
            # Embedding rows are small (std 0.5); a matrix's outputs keep about the input's scale.
            std = 0.5 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[1])
            data = random_blocks(rng, shape[0], shape[1], quant, std)
        elif name.endswith("norm.weight"):
            data = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        else:  # biases
            data = rng.normal(0.0, 0.02, shape).astype(np.float32)
        w.write_tensor_data(data)
        if log and (i % 50 == 0 or i == len(plan) - 1):
            log(f"{i + 1}/{len(plan)} tensors, {time.perf_counter() - started:.1f} s")
    w.close()
    return os.path.getsize(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arch", choices=sorted(ARCHS))
    p.add_argument("quant", choices=sorted(QUANTS))
    p.add_argument("out")
    p.add_argument("--scale", type=float, default=1.0, help="shrink width, feed-forward and vocabulary (0, 1]")
    p.add_argument("--layers", type=int, default=None, help="number of blocks (default: the real model's)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    started = time.perf_counter()
    size = write(a.out, a.arch, a.quant, a.scale, a.layers, a.seed, log=lambda m: print(m, file=sys.stderr))
    print(f"{a.out}: {size / 1e9:.3f} GB in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
