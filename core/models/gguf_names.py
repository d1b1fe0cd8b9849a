"""llama.cpp GGUF files as Hugging Face checkpoints: the config rebuilt from
`{arch}.*` metadata, and tensors renamed (token_embd -> model.embed_tokens,
blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...), so the models load a
GGUF exactly as they load a config.json + safetensors directory.

What differs between architectures (their tensor names, the settings llama.cpp
fixes per architecture instead of storing them) comes from each one's
registration (architectures.py; e.g. Llama's rope_interleaved, Gemma 3's norm
offset, Phi-2's fused attn_qkv). This file holds what they share: the metadata
keys every llama.cpp decoder writes, rope scaling, and the name tables below.

Phi-2's fused attn_qkv (an Architecture's gguf_fused_qkv) is split into q/k/v by
row ranges of its bytes, which works for quantised blocks too (a row is whole blocks).
"""
import re

from ..config_fields import MAX_COUNT, Fields
from ..creation import from_buffer
from ..errors import FormatError, UnsupportedError
from .architectures import by_gguf_arch

# llama.cpp's per-block names shared by many architectures (-> Hugging Face names below model.layers.N.)
ATTENTION_BLOCKS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_norm": "input_layernorm",
}
LLAMA_BLOCKS = {**ATTENTION_BLOCKS, "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
QK_NORM_BLOCKS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# tensors that are settings, not weights (read into the config)
_SETTINGS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name, arch):
    """The Hugging Face name of a llama.cpp tensor name in an Architecture, or None if it has none."""
    m = _BLOCK_NAME.match(gguf_name)
    if m:
        block, part, kind = m.groups()
        mapped = arch.gguf_blocks.get(part)
        return None if mapped is None else f"model.layers.{block}.{mapped}.{kind}"
    base, _, kind = gguf_name.rpartition(".")
    mapped = arch.gguf_top.get(base)
    return None if mapped is None else f"{mapped}.{kind}"


def _floats(reader, name):
    return [float(v) for v in reader.tensor(name, "python").to("f32").tolist()]


def config_from_gguf(reader):
    """(Architecture, a Hugging Face-style config dict) from a GGUF reader's metadata (and
    its rope factor tensors)."""
    meta = reader.metadata
    path = getattr(reader, "path", "GGUF")
    arch = meta.get("general.architecture")
    registered = by_gguf_arch(arch, path)
    model_type = registered.model_type

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
    _check_vocabulary_covers(reader, path, hidden)
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
    if registered.gguf_config is not None:
        cfg.update(registered.gguf_config(g, cfg))
    cfg["rope_scaling"] = _rope_scaling(reader, g, path, cfg)
    return registered, cfg


def _check_vocabulary_covers(reader, path, hidden):
    """Every id the model can take or produce (a row of token_embd.weight, or of output.weight,
    whose rows are the logits) is a token of the file's vocabulary. A vocabulary cut shorter
    would load, then fail mid-generation on the first id past its end ("token id 8318 is
    outside the vocabulary") without naming the file. A longer one is harmless for generation."""
    tokens = reader.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not set(map(type, tokens)) <= {str}:  # (a C loop: 151k-262k tokens)
        return  # no vocabulary, or a malformed one: the tokenizer names what is wrong with it
    for name in ("token_embd.weight", "output.weight"):
        if name not in reader:
            continue
        shape = reader.info(name).shape
        if len(shape) != 2 or shape[1] != hidden:
            raise FormatError(f"{path}: {name} has shape {shape}, expected (vocab, embedding_length = {hidden})")
        if shape[0] > len(tokens):
            raise FormatError(f"{path}: tokenizer.ggml.tokens holds {len(tokens)} tokens but {name} has {shape[0]} "
                              f"rows: the model could produce ids past the vocabulary; the vocabulary or the "
                              f"tensor was cut (or is from another model)")


def _end_ids(tok, vocab_size):
    """The ids that end a reply: eos, and the end-of-turn / end-of-message tokens that chat
    GGUFs may name separately (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        tid = tok.token_id(key, vocab_size)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


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

    def __init__(self, reader, config, arch):
        self.reader = reader
        self.path = getattr(reader, "path", "GGUF")
        self._names = {}   # HF name -> GGUF name
        self._splits = {}  # HF name -> (GGUF name, first row, rows)
        fused = f".{arch.gguf_fused_qkv}." if arch.gguf_fused_qkv else None  # split into q/k/v below
        for name in reader.keys():
            if name in _SETTINGS or (fused and fused in name):
                continue
            mapped = hf_name(name, arch)
            if mapped is None:
                raise UnsupportedError(f"{self.path}: tensor {name!r} has no place in a {arch.model_type} model")
            self._names[mapped] = name
        if fused:
            self._split_fused_qkv(config, fused)
        self._keys = frozenset(self._names) | frozenset(self._splits)

    def _split_fused_qkv(self, config, fused):
        q_rows = config["num_attention_heads"] * config["head_dim"]
        kv_rows = config["num_key_value_heads"] * config["head_dim"]
        for name in [n for n in self.reader.keys() if fused in n]:
            m = _BLOCK_NAME.match(name)
            block, kind = m.group(1), m.group(3)
            prefix = f"model.layers.{block}.self_attn"
            parts = (("q_proj", 0, q_rows), ("k_proj", q_rows, kv_rows), ("v_proj", q_rows + kv_rows, kv_rows))
            for part, start, rows in parts:
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
