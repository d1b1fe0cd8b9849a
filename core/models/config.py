"""Model configs: a Hugging Face config.json (or one rebuilt from GGUF
metadata) read into one flat object the decoder models share.

Checkpoints spell the rotary settings two ways: older config.json files have
top-level `rope_theta` / `rope_scaling` / `partial_rotary_factor`, newer ones
(transformers 5) a `rope_parameters` dict. Both are read here, once.

What a model_type implies but its configs leave out (Gemma 3 ties its embeddings,
Qwen2 has q/k/v biases...) comes from its registration (architectures.py): those
defaults sit under the config's own fields, so this file knows no architecture.
"""
import os

from ..config_fields import MAX_COUNT, Fields
from ..errors import FormatError, UnsupportedError
from ..json_file import read_json
from .architectures import config_defaults

# rope_scaling kinds tallow implements (nn/rotary.py)
ROPE_KINDS = ("default", "linear", "llama3", "longrope", "su", "freq_factors")
# What each layer's attention is (transformers' config.layer_types)
LAYER_TYPES = ("full_attention", "sliding_attention")


class DecoderConfig:
    """The fields a decoder-only transformer needs, with the checkpoints' defaults,
    each checked for type and range (see config_fields.py)."""

    def __init__(self, raw, source="config.json"):
        if not isinstance(raw, dict):
            raise FormatError(f"{source}: a config must be a JSON object")
        self.source = source
        model_type = Fields(raw, source).str("model_type", "llama")
        raw = self.raw = dict(raw)
        for key, value in config_defaults(model_type).items():  # a null field takes the default too
            if raw.get(key) is None:
                raw[key] = value
        f = self.fields = Fields(raw, source)
        self.model_type = model_type
        self.vocab_size = f.int("vocab_size", lo=1, hi=MAX_COUNT)
        self.hidden_size = f.int("hidden_size", lo=1, hi=MAX_COUNT)
        self.intermediate_size = f.int("intermediate_size", 4 * self.hidden_size, lo=1, hi=MAX_COUNT)
        self.num_layers = f.int("num_hidden_layers", lo=1, hi=MAX_COUNT)
        self.num_heads = f.int("num_attention_heads", lo=1, hi=self.hidden_size)
        self.num_kv_heads = f.int("num_key_value_heads", self.num_heads, lo=1, hi=self.num_heads)
        if self.num_heads % self.num_kv_heads:
            f.fail("num_key_value_heads", self.num_kv_heads,
                   f"a divisor of num_attention_heads ({self.num_heads})")
        if not f.has("head_dim") and self.hidden_size % self.num_heads:
            f.fail("num_attention_heads", self.num_heads, f"a divisor of hidden_size ({self.hidden_size})")
        self.head_dim = f.int("head_dim", self.hidden_size // self.num_heads, lo=1, hi=MAX_COUNT)
        self.max_position_embeddings = f.int("max_position_embeddings", 2048, lo=1)
        self.rms_norm_eps = f.float("rms_norm_eps", 1e-6, positive=True)
        self.layer_norm_eps = f.float("layer_norm_eps", 1e-5, positive=True)
        # Gemma names it hidden_activation
        self.hidden_act = f.str("hidden_activation", None) or f.str("hidden_act", "silu")
        self.tie_word_embeddings = f.bool("tie_word_embeddings", False)
        self.attention_bias = f.bool("attention_bias", False)
        self.mlp_bias = f.bool("mlp_bias", False)
        self.qk_layernorm = f.bool("qk_layernorm", False)
        self.qkv_bias = self.attention_bias or f.bool("qkv_bias", False)  # Qwen2: biases on q/k/v only
        self.qk_norm = f.bool("qk_norm", False)  # Qwen3: RMSNorm on each q/k head
        self.sliding_window = self._sliding_window()
        self.layer_types = self._layer_types()
        self._read_rope()
        # Gemma 3: attention scaled by query_pre_attn_scalar**-0.5 instead of head_dim**-0.5,
        # an optional tanh soft cap on the final logits, and RMSNorm weights stored as
        # offsets from 1 (GGUF files hold them with the 1 already added: offset 0).
        scalar = f.float("query_pre_attn_scalar", None, positive=True)
        self.attention_scale = None if scalar is None else scalar ** -0.5
        if f.float("attn_logit_softcapping", None, positive=True) is not None:
            # Gemma 2's score cap: transformers' Gemma 3 ignores it, llama.cpp refuses it.
            raise UnsupportedError(f"{source}: attn_logit_softcapping = {raw['attn_logit_softcapping']} is not "
                                   "supported (Gemma 3 checkpoints leave it null; set it to null to run as "
                                   "transformers' Gemma 3 does)")
        self.final_logit_softcapping = f.float("final_logit_softcapping", None, positive=True)
        self.norm_weight_offset = f.float("norm_weight_offset", 0.0)
        # GGUF llama weights have q/k rows permuted for interleaved rotary (see gguf_names.py).
        self.rope_interleaved = f.bool("rope_interleaved", False)
        self.bos_token_id = f.token_id("bos_token_id", self.vocab_size)
        self.eos_token_ids = f.token_ids("eos_token_id", self.vocab_size)

    def _sliding_window(self):
        f = self.fields
        # Qwen2 configs carry a window but only use it when use_sliding_window is set.
        if f.get("use_sliding_window", None) is False:
            return None
        return f.int("sliding_window", 0, lo=0) or None

    def _layer_types(self):
        """Each layer's attention: config.layer_types, else sliding_window_pattern (Gemma 3:
        every n-th layer global), else every layer alike (sliding when a window is set)."""
        f = self.fields
        types = f.get("layer_types", None)
        if types is not None:
            if not isinstance(types, list) or len(types) != self.num_layers or any(t not in LAYER_TYPES for t in types):
                f.fail("layer_types", types, f"a list of {self.num_layers} (num_hidden_layers) entries, "
                                             f"each one of {', '.join(LAYER_TYPES)}")
            return list(types)
        if f.has("sliding_window_pattern"):
            n = f.int("sliding_window_pattern", lo=1)
            return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(self.num_layers)]
        return ["sliding_attention" if self.sliding_window else "full_attention"] * self.num_layers

    def window(self, layer_type):
        """The attention window of a layer type (None: the whole context)."""
        return self.sliding_window if layer_type == "sliding_attention" else None

    def _read_rope(self):
        """The rotary settings of full-attention layers (rope_theta, rope_scaling) and of
        sliding ones (`ropes`): Gemma 3 gives its sliding layers their own base, either as
        rope_local_base_freq or (transformers 5) as rope_parameters.sliding_attention."""
        f = self.fields
        params = f.dict("rope_parameters")
        per_type = any(t in params for t in LAYER_TYPES)
        full = Fields(params, self.source, label="rope_parameters.").dict("full_attention") if per_type else params
        p = Fields(full, self.source, label="rope_parameters.full_attention." if per_type else "rope_parameters.")
        self.partial_rotary_factor = p.float("partial_rotary_factor",
                                             f.float("partial_rotary_factor", 1.0, lo=0.0, hi=1.0),
                                             lo=0.0, hi=1.0)
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        if self.rotary_dim % 2 or self.rotary_dim == 0:
            raise FormatError(f"{self.source}: the rotary dim {self.rotary_dim} (head_dim {self.head_dim} x "
                              f"partial_rotary_factor {self.partial_rotary_factor}) must be even and > 0")
        default_theta = f.float("rope_theta", 10000.0, positive=True)
        self.rope_theta, self.rope_scaling = self._rope(full, f.dict("rope_scaling"), default_theta, p.label)
        if per_type and "sliding_attention" in params:
            label = "rope_parameters.sliding_attention."
            sliding = self._rope(Fields(params, self.source, label="rope_parameters.").dict("sliding_attention"),
                                 {}, 10000.0, label)
        elif f.has("rope_local_base_freq"):  # older Gemma 3 configs: the scaling applies to global layers only
            sliding = (f.float("rope_local_base_freq", 10000.0, positive=True), None)
        else:
            sliding = (self.rope_theta, self.rope_scaling)
        self.ropes = {"full_attention": (self.rope_theta, self.rope_scaling), "sliding_attention": sliding}

    def _rope(self, params, scaling, default_theta, label):
        """(theta, rope_scaling or None) from one rope_parameters dict and a rope_scaling dict."""
        p = Fields(params, self.source, label=label)
        theta = p.float("rope_theta", default_theta, positive=True)
        kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if kind not in ROPE_KINDS:
            raise UnsupportedError(f"{self.source}: rope type {kind!r} is not supported "
                                   f"(supported: {', '.join(ROPE_KINDS)})")
        if kind == "default":
            return theta, None
        merged = {**scaling, **params, "rope_type": kind}
        for key in ("original_max_position_embeddings", "max_position_embeddings"):
            if key not in merged and self.raw.get(key):
                merged[key] = self.raw[key]
        self._check_rope_scaling(Fields(merged, self.source, label="rope_scaling."), kind)
        return theta, merged

    def _check_rope_scaling(self, s, kind):
        """The fields nn/rotary.py reads for this kind, checked before the first forward needs them."""
        half = self.rotary_dim // 2
        if kind == "linear":
            s.float("factor", positive=True)
        elif kind == "llama3":
            s.float("factor", positive=True)
            low, high = s.float("low_freq_factor", positive=True), s.float("high_freq_factor", positive=True)
            if low == high:
                s.fail("high_freq_factor", high, "different from low_freq_factor")
            s.positive_int("original_max_position_embeddings")
        elif kind in ("longrope", "su"):
            s.positive_int("original_max_position_embeddings")
            for key in ("long_factor", "short_factor"):
                self._factor_list(s, key, half)
            s.float("factor", None, positive=True)
            s.float("attention_factor", None, positive=True)
            if not s.has("factor"):
                s.positive_int("max_position_embeddings")
        elif kind == "freq_factors":
            self._factor_list(s, "factors", half)

    @staticmethod
    def _factor_list(s, key, n):
        value = s.get(key)
        if (not isinstance(value, list) or len(value) != n
                or not all(type(v) in (int, float) and 0 < v < float("inf") for v in value)):
            s.fail(key, value, f"a list of {n} finite numbers > 0 (one per rotary frequency)")

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
