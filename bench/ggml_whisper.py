"""Write a Hugging Face Whisper checkpoint (the tallow cache's safetensors) as whisper.cpp's legacy
ggml model file, so bench/web_cpu.py can run whisper.cpp's wasm build on the very weights tallow
runs. The layout is the one whisper.cpp documents for its `models/convert-h5-to-ggml.py`:

    i32 magic 0x67676d6c, then 11 i32 hyper-parameters (vocab, audio ctx, audio state, audio heads,
    audio layers, text ctx, text state, text heads, text layers, mels, ftype=1 for f16),
    the mel filter bank (i32 rows, i32 cols, f32 values), the byte-level vocabulary (i32 count, then
    each token as i32 length + raw bytes, in id order), then every tensor: i32 n_dims, i32 name length,
    i32 ftype (0 f32, 1 f16), the dims innermost first, the name, the data.

Matrices go as f16, vectors, conv biases (as [n, 1]) and positional embeddings as f32; the tied
`proj_out` is not written (whisper.cpp reuses the token embedding).

    python bench/ggml_whisper.py [MODEL_DIR] [OUT]
"""
import json
import os
import struct
import sys

import numpy as np

MAGIC = 0x67676D6C

# Hugging Face module names -> whisper.cpp's (OpenAI's original) names
LAYER_PARTS = {
    "self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
}
TOP_LEVEL = {
    "encoder.layer_norm.weight": "encoder.ln_post.weight", "encoder.layer_norm.bias": "encoder.ln_post.bias",
    "encoder.embed_positions.weight": "encoder.positional_embedding",
    "decoder.layer_norm.weight": "decoder.ln.weight", "decoder.layer_norm.bias": "decoder.ln.bias",
    "decoder.embed_positions.weight": "decoder.positional_embedding",
    "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
}
KEEP_F32 = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
            "decoder.positional_embedding")


def ggml_name(hf_name):
    """'model.encoder.layers.0.fc1.weight' -> 'encoder.blocks.0.mlp.0.weight'; None for tensors
    whisper.cpp does not read (the tied output projection)."""
    if hf_name == "proj_out.weight":
        return None
    parts = hf_name.split(".")
    if parts[0] == "model":
        parts = parts[1:]
    if len(parts) > 3 and parts[1] == "layers":
        module = ".".join(parts[3:-1])
        if module not in LAYER_PARTS:
            raise ValueError(f"unknown Whisper layer tensor {hf_name!r}")
        return ".".join([parts[0], "blocks", parts[2], LAYER_PARTS[module], parts[-1]])
    name = ".".join(parts)
    return TOP_LEVEL.get(name, name)


def byte_decoder():
    """GPT-2's byte-level alphabet, reversed: the character a vocabulary entry spells -> its byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def convert(model_dir, out_path):
    """Writes out_path; returns its size in bytes."""
    from safetensors import safe_open
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    n_mels = cfg["num_mel_bins"]
    with np.load(os.path.join(model_dir, "mel_filters.npz")) as f:
        filters = np.asarray(f[f"mel_{n_mels}"], np.float32)
    decode = byte_decoder()
    tmp = out_path + ".part"
    with open(tmp, "wb") as out, safe_open(os.path.join(model_dir, "model.safetensors"), "np") as weights:
        out.write(struct.pack("<12i", MAGIC, cfg["vocab_size"], cfg["max_source_positions"], cfg["d_model"],
                              cfg["encoder_attention_heads"], cfg["encoder_layers"], cfg["max_target_positions"],
                              cfg["d_model"], cfg["decoder_attention_heads"], cfg["decoder_layers"], n_mels, 1))
        out.write(struct.pack("<2i", *filters.shape))
        out.write(filters.tobytes())
        out.write(struct.pack("<i", len(vocab)))
        for piece, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            raw = bytes(decode[c] for c in piece)
            out.write(struct.pack("<i", len(raw)) + raw)
        for hf_name in weights.keys():
            name = ggml_name(hf_name)
            if name is None:
                continue
            data = np.squeeze(weights.get_tensor(hf_name))
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            f32 = data.ndim < 2 or name in KEEP_F32
            data = np.ascontiguousarray(data, np.float32 if f32 else np.float16)
            encoded = name.encode()
            out.write(struct.pack("<3i", data.ndim, len(encoded), 0 if f32 else 1))
            out.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            out.write(encoded)
            out.write(data.tobytes())
    os.replace(tmp, out_path)
    return os.path.getsize(out_path)


def main():
    home = os.environ.get("TALLOW_HOME", os.path.expanduser("~/.cache/tallow"))
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(home, "whisper-tiny.en")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(home, "ggml", "ggml-tiny.en.bin")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    print(out, convert(model_dir, out), "bytes")


if __name__ == "__main__":
    main()
