"""Model configs: a Hugging Face config.json (or one rebuilt from GGUF
metadata) read into one flat object the decoder models share.

Checkpoints spell the rotary settings two ways: older config.json files have
top-level `rope_theta` / `rope_scaling` / `partial_rotary_factor`, newer ones
(transformers 5) a `rope_parameters` dict. Both are read here, once.
"""
import json
import os

from ..errors import FormatError


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON: {e}") from None


class DecoderConfig:
    """The fields a decoder-only transformer needs, with the checkpoints' defaults."""

    def __init__(self, raw, source="config.json"):
        if not isinstance(raw, dict):
            raise FormatError(f"{source}: a config must be a JSON object")
        self.raw, self.source = raw, source
        self.model_type = raw.get("model_type", "llama")
        self.vocab_size = self._int("vocab_size")
        self.hidden_size = self._int("hidden_size")
        self.intermediate_size = self._int("intermediate_size", 4 * self.hidden_size)
        self.num_layers = self._int("num_hidden_layers")
        self.num_heads = self._int("num_attention_heads")
        self.num_kv_heads = int(raw.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(raw.get("head_dim") or self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise FormatError(f"{source}: num_attention_heads {self.num_heads} is not a multiple of "
                              f"num_key_value_heads {self.num_kv_heads}")
        self.max_position_embeddings = int(raw.get("max_position_embeddings") or 2048)
        self.rms_norm_eps = float(raw.get("rms_norm_eps", 1e-6))
        self.layer_norm_eps = float(raw.get("layer_norm_eps", 1e-5))
        self.hidden_act = raw.get("hidden_act", "silu")
        self.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))
        self.attention_bias = bool(raw.get("attention_bias", False))
        self.mlp_bias = bool(raw.get("mlp_bias", False))
        self.qk_layernorm = bool(raw.get("qk_layernorm", False))
        self.sliding_window = self._sliding_window()
        self._read_rope()
        # GGUF llama weights have q/k rows permuted for interleaved rotary (see gguf_names.py).
        self.rope_interleaved = bool(raw.get("rope_interleaved", False))
        self.bos_token_id = raw.get("bos_token_id")
        eos = raw.get("eos_token_id")
        self.eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    def _int(self, key, default=None):
        value = self.raw.get(key, default)
        if value is None:
            raise FormatError(f"{self.source}: missing {key!r}")
        return int(value)

    def _sliding_window(self):
        window = self.raw.get("sliding_window")
        # Qwen2 configs carry a window but only use it when use_sliding_window is set.
        if self.raw.get("use_sliding_window") is False:
            return None
        return int(window) if window else None

    def _read_rope(self):
        raw = self.raw
        params = dict(raw.get("rope_parameters") or {})
        scaling = dict(raw.get("rope_scaling") or {})
        self.rope_theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        self.partial_rotary_factor = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
        kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if kind == "default":
            self.rope_scaling = None
        else:
            merged = {**scaling, **params, "rope_type": kind}
            for key in ("original_max_position_embeddings", "max_position_embeddings"):
                if key not in merged and raw.get(key):
                    merged[key] = raw[key]
            self.rope_scaling = merged
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        if self.rotary_dim % 2:
            raise FormatError(f"{self.source}: the rotary dim {self.rotary_dim} (head_dim {self.head_dim} x "
                              f"partial_rotary_factor {self.partial_rotary_factor}) must be even")

    @property
    def longrope_switch(self):
        """Past this many positions longrope switches to its long factors (None: no switch)."""
        s = self.rope_scaling
        if s and s.get("rope_type") in ("longrope", "su"):
            return int(s["original_max_position_embeddings"])
        return None

    def __repr__(self):
        return (f"DecoderConfig({self.model_type}: {self.num_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_heads}/{self.num_kv_heads} heads, vocab {self.vocab_size})")


def load_config(path):
    """DecoderConfig from a config.json path or a directory holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    return DecoderConfig(read_json(path), source=path)
