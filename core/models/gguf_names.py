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
- Gemma 3's norm weights hold the full scale (llama.cpp's converter adds the 1
  that Hugging Face's Gemma RMSNorm adds at run time): the config gets
  norm_weight_offset=0.
- Phi-2's fused attn_qkv is split into q/k/v by row ranges of its bytes, which
  works for quantised blocks too (a row is whole blocks).
"""
import re

from ..config_fields import MAX_COUNT, Fields
from ..creation import from_buffer
from ..errors import FormatError, UnsupportedError

# general.architecture -> the model_type of our implementations
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "phi2": "phi",
                 "gemma3": "gemma3_text"}

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
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_BLOCK["qwen3"] = {**_BLOCK["llama"], **_QK_NORM}
_BLOCK["gemma3_text"] = {**_BLOCK["llama"], **_QK_NORM, "post_attention_norm": "post_attention_layernorm",
                         "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
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
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise UnsupportedError(f"{path}: GGUF architecture {arch!r} is not supported "
                               f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    model_type = ARCHITECTURES[arch]

    g = Fields(meta, path, prefix=f"{arch}.")
    if isinstance(g.get("attention.head_count_kv", None), list):
        raise UnsupportedError(f"{path}: per-layer head_count_kv is not supported")
    hidden = g.int("embedding_length", lo=1, hi=MAX_COUNT)
    heads = g.int("attention.head_count", lo=1, hi=hidden)
    kv_heads = g.int("attention.head_count_kv", heads, lo=1, hi=heads)
    if heads % kv_heads:
        g.fail("attention.head_count_kv", kv_heads, f"a divisor of attention.head_count ({heads})")
    if not g.has("attention.key_length") and hidden % heads:
        g.fail("attention.head_count", heads, f"a divisor of embedding_length ({hidden})")
    head_dim = g.int("attention.key_length", hidden // heads, lo=1, hi=MAX_COUNT)
    if "token_embd.weight" not in reader:
        raise FormatError(f"{path}: GGUF has no token_embd.weight")
    embd_shape = reader.info("token_embd.weight").shape
    if len(embd_shape) != 2 or embd_shape[1] != hidden:
        raise FormatError(f"{path}: token_embd.weight has shape {embd_shape}, expected (vocab, {arch}.embedding_length "
                          f"= {hidden})")
    tok = Fields(meta, path, prefix="tokenizer.ggml.")  # bos/eos must be rows of token_embd
    cfg = {
        "model_type": model_type,
        "vocab_size": int(embd_shape[0]),
        "hidden_size": hidden,
        "intermediate_size": g.int("feed_forward_length", 4 * hidden, lo=1, hi=MAX_COUNT),
        "num_hidden_layers": g.int("block_count", lo=1, hi=MAX_COUNT),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": g.int("context_length", 2048, lo=1),
        "rope_theta": g.float("rope.freq_base", 10000.0, positive=True),
        "tie_word_embeddings": "output.weight" not in reader,
        "rope_interleaved": arch == "llama",
        "bos_token_id": tok.token_id("bos_token_id", int(embd_shape[0])),
        "eos_token_id": _end_ids(tok, int(embd_shape[0])),
    }
    if g.has("attention.layer_norm_rms_epsilon"):
        cfg["rms_norm_eps"] = g.float("attention.layer_norm_rms_epsilon", positive=True)
    if g.has("attention.layer_norm_epsilon"):
        cfg["layer_norm_eps"] = g.float("attention.layer_norm_epsilon", positive=True)
    if g.has("rope.dimension_count"):
        cfg["partial_rotary_factor"] = g.int("rope.dimension_count", lo=2, hi=head_dim) / head_dim
    if g.get("attention.sliding_window", None):
        cfg["sliding_window"] = g.int("attention.sliding_window", lo=1)
    if model_type == "phi":
        cfg["hidden_act"] = "gelu_new"
    if model_type == "gemma3_text":
        cfg.update(_gemma3(g, cfg))
    cfg["rope_scaling"] = _rope_scaling(reader, g, path, cfg)
    return cfg


def _end_ids(tok, vocab_size):
    """The ids that end a reply: eos, and the end-of-turn / end-of-message tokens that chat
    GGUFs may name separately (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        tid = tok.token_id(key, vocab_size)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


def _gemma3(g, cfg):
    """What llama.cpp fixes for gemma3 rather than storing: every 6th layer global unless
    attention.sliding_window_pattern says otherwise (an int n, or one bool per layer, true
    = sliding), a rope base of 10000 on sliding layers, query_pre_attn_scalar = head_dim
    (hidden / heads for the 62-layer 27B), GELU-tanh; norms stored with the 1 added."""
    n = cfg["num_hidden_layers"]
    pattern = g.get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != n or any(type(v) is not bool for v in pattern):
            g.fail("attention.sliding_window_pattern", pattern, f"an integer or {n} booleans (one per block)")
        sliding = pattern
    else:
        every = g.int("attention.sliding_window_pattern", 6, lo=1)
        sliding = [bool((i + 1) % every) for i in range(n)]
    out = {"layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
           "rope_local_base_freq": 10000.0, "hidden_act": "gelu_pytorch_tanh", "norm_weight_offset": 0.0,
           "query_pre_attn_scalar": cfg["hidden_size"] // cfg["num_attention_heads"] if n == 62 else cfg["head_dim"]}
    if not g.has("rope.freq_base"):
        out["rope_theta"] = 1_000_000.0  # transformers' Gemma 3 default for global layers
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if g.has(key):
            out[key] = g.float(key, positive=True)
    return out


def _rope_scaling(reader, g, path, cfg):
    if "rope_factors_long.weight" in reader:  # Phi-3.5 / Phi-4-mini longrope
        if not g.has("rope.scaling.original_context_length"):
            raise FormatError(f"{path}: longrope factors without rope.scaling.original_context_length")
        scaling = {"rope_type": "longrope",
                   "original_max_position_embeddings": g.positive_int("rope.scaling.original_context_length"),
                   "max_position_embeddings": cfg["max_position_embeddings"],
                   "long_factor": _floats(reader, "rope_factors_long.weight"),
                   "short_factor": _floats(reader, "rope_factors_short.weight")}
        if g.has("rope.scaling.attn_factor"):
            scaling["attention_factor"] = g.float("rope.scaling.attn_factor", positive=True)
        return scaling
    if "rope_freqs.weight" in reader:  # Llama 3.1+: llama.cpp stores the per-frequency divisors
        return {"rope_type": "freq_factors", "factors": _floats(reader, "rope_freqs.weight")}
    kind = g.str("rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": g.float("rope.scaling.factor", positive=True)}
    raise UnsupportedError(f"{path}: GGUF rope scaling {kind!r} is not supported (linear, longrope, rope_freqs)")


class GGUFWeights:
    """A GGUF reader seen through Hugging Face tensor names (what VarBuilder asks for)."""

    def __init__(self, reader, config):
        self.reader = reader
        self.path = getattr(reader, "path", "GGUF")
        model_type = config["model_type"]
        self._names = {}   # HF name -> GGUF name
        self._splits = {}  # HF name -> (GGUF name, first row, rows)
        fused_qkv = model_type == "phi"  # split into q/k/v below
        for name in reader.keys():
            if name in _SETTINGS or (fused_qkv and ".attn_qkv." in name):
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
        info = self.reader._loadable(gguf_name)
        row_bytes = info.nbytes // info.shape[0]
        source = getattr(self.reader, "source", None)
        if source is not None:  # a JS buffer or sliced file: its rows go straight to the device when it can
            from ..io.byte_source import direct_tensor
            from ..io.lazy_file import TensorInfo
            part = TensorInfo(name, info.dtype, info.file_dtype, (rows,) + tuple(info.shape[1:]), rows * row_bytes,
                              info.offset + start * row_bytes)
            t = direct_tensor(source, part, device)
            if t is not None:
                return t
        raw = self.reader.raw(gguf_name)[start * row_bytes:(start + rows) * row_bytes]
        return from_buffer(raw, info.dtype, (rows,) + tuple(info.shape[1:]), device)
