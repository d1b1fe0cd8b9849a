"""llama.cpp GGUF files as Hugging Face checkpoints: the config rebuilt from
`{arch}.*` metadata, and tensors renamed (token_embd -> model.embed_tokens,
blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...), so the models load a
GGUF exactly as they load a config.json + safetensors directory.

Two conversions llama.cpp makes are undone here without touching weights:
- For the "llama" architecture, llama.cpp's converter permutes the rows of
  attn_q/attn_k inside each head (HF's half-split rotary -> ggml's interleaved
  pairs). A per-head row permutation applied to both q and k leaves q.k
  unchanged, so instead of un-permuting (quantised) rows we rotate interleaved
  pairs: the config gets rope_interleaved=True.
- Phi-2's fused attn_qkv is split into q/k/v by row ranges of its bytes, which
  works for quantised blocks too (a row is whole blocks).
"""
import re

from ..creation import from_buffer
from ..errors import FormatError, UnsupportedError

# general.architecture -> the model_type of our implementations
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "phi2": "phi"}

# per-block names: llama.cpp -> HF, by architecture family
_BLOCK_COMMON = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_norm": "input_layernorm",
}
_BLOCK = {
    "llama": {**_BLOCK_COMMON, "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"},
    "phi3": {**_BLOCK_COMMON, "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
    "phi": {**_BLOCK_COMMON, "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"},
}
_BLOCK["qwen2"] = _BLOCK["llama"]
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TOP_PHI = {**_TOP, "output_norm": "model.final_layernorm"}
# tensors that are settings, not weights (read into the config)
_SETTINGS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name, model_type):
    """The Hugging Face name of a llama.cpp tensor name, or None if it has none here."""
    m = _BLOCK_NAME.match(gguf_name)
    if m:
        block, part, kind = m.groups()
        mapped = _BLOCK[model_type].get(part)
        return None if mapped is None else f"model.layers.{block}.{mapped}.{kind}"
    base, _, kind = gguf_name.rpartition(".")
    mapped = (_TOP_PHI if model_type == "phi" else _TOP).get(base)
    return None if mapped is None else f"{mapped}.{kind}"


def _floats(reader, name):
    return [float(v) for v in reader.tensor(name, "python").to("f32").tolist()]


def config_from_gguf(reader):
    """A Hugging Face-style config dict from a GGUF reader's metadata (and its rope factor tensors)."""
    meta = reader.metadata
    path = getattr(reader, "path", "GGUF")
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"{path}: GGUF architecture {arch!r} is not supported "
                               f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    model_type = ARCHITECTURES[arch]

    def g(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    for key in ("embedding_length", "block_count", "attention.head_count"):
        if g(key) is None:
            raise FormatError(f"{path}: GGUF metadata lacks {arch}.{key}")
    heads = int(g("attention.head_count"))
    kv_heads = g("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise UnsupportedError(f"{path}: per-layer head_count_kv is not supported")
    hidden = int(g("embedding_length"))
    head_dim = int(g("attention.key_length") or hidden // heads)
    if "token_embd.weight" not in reader:
        raise FormatError(f"{path}: GGUF has no token_embd.weight")
    cfg = {
        "model_type": model_type,
        "vocab_size": int(reader.info("token_embd.weight").shape[0]),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length", 4 * hidden)),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "max_position_embeddings": int(g("context_length", 2048)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in reader,
        "rope_interleaved": arch == "llama",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if g("attention.layer_norm_rms_epsilon") is not None:
        cfg["rms_norm_eps"] = float(g("attention.layer_norm_rms_epsilon"))
    if g("attention.layer_norm_epsilon") is not None:
        cfg["layer_norm_eps"] = float(g("attention.layer_norm_epsilon"))
    if g("rope.dimension_count"):
        cfg["partial_rotary_factor"] = int(g("rope.dimension_count")) / head_dim
    if g("attention.sliding_window"):
        cfg["sliding_window"] = int(g("attention.sliding_window"))
    if model_type == "phi":
        cfg["hidden_act"] = "gelu_new"
    cfg["rope_scaling"] = _rope_scaling(reader, g, path, cfg)
    return cfg


def _rope_scaling(reader, g, path, cfg):
    if "rope_factors_long.weight" in reader:  # Phi-3.5 / Phi-4-mini longrope
        original = g("rope.scaling.original_context_length")
        if original is None:
            raise FormatError(f"{path}: longrope factors without rope.scaling.original_context_length")
        scaling = {"rope_type": "longrope", "original_max_position_embeddings": int(original),
                   "max_position_embeddings": cfg["max_position_embeddings"],
                   "long_factor": _floats(reader, "rope_factors_long.weight"),
                   "short_factor": _floats(reader, "rope_factors_short.weight")}
        if g("rope.scaling.attn_factor") is not None:
            scaling["attention_factor"] = float(g("rope.scaling.attn_factor"))
        return scaling
    if "rope_freqs.weight" in reader:  # Llama 3.1+: llama.cpp stores the per-frequency divisors
        return {"rope_type": "freq_factors", "factors": _floats(reader, "rope_freqs.weight")}
    kind = g("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    raise UnsupportedError(f"{path}: GGUF rope scaling {kind!r} is not supported (linear, longrope, rope_freqs)")


class GGUFWeights:
    """A GGUF reader seen through Hugging Face tensor names (what VarBuilder asks for)."""

    def __init__(self, reader, config):
        self.reader = reader
        self.path = getattr(reader, "path", "GGUF")
        model_type = config["model_type"]
        self._names = {}   # HF name -> GGUF name
        self._splits = {}  # HF name -> (GGUF name, first row, rows)
        for name in reader.keys():
            if name in _SETTINGS:
                continue
            mapped = hf_name(name, model_type)
            if mapped is None:
                raise UnsupportedError(f"{self.path}: tensor {name!r} has no place in a {model_type} model")
            self._names[mapped] = name
        if model_type == "phi":
            self._split_fused_qkv(config)
        self._keys = frozenset(self._names) | frozenset(self._splits)

    def _split_fused_qkv(self, config):
        q_rows = config["num_attention_heads"] * config["head_dim"]
        kv_rows = config["num_key_value_heads"] * config["head_dim"]
        for name in [n for n in self.reader.keys() if ".attn_qkv." in n]:
            m = _BLOCK_NAME.match(name)
            block, kind = m.group(1), m.group(3)
            prefix = f"model.layers.{block}.self_attn"
            for part, start, rows in (("q_proj", 0, q_rows), ("k_proj", q_rows, kv_rows), ("v_proj", q_rows + kv_rows, kv_rows)):
                self._splits[f"{prefix}.{part}.{kind}"] = (name, start, rows)

    def keys(self):
        return self._keys

    def tensor(self, name, device=None):
        if name in self._names:
            return self.reader.tensor(self._names[name], device)
        gguf_name, start, rows = self._splits[name]
        info = self.reader.info(gguf_name)
        row_bytes = info.nbytes // info.shape[0]
        raw = self.reader.raw(gguf_name)[start * row_bytes:(start + rows) * row_bytes]
        return from_buffer(raw, info.dtype, (rows,) + tuple(info.shape[1:]), device)
