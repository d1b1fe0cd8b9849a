"""Gemma 3 text decoders (transformers' Gemma3ForCausalLM, model_type gemma3_text;
GGUF architecture gemma3): Gemma 3 270M / 1B and the text tower of the larger ones.

Per block: RMSNorm before and after attention and before and after the MLP
(weights stored as offsets from 1), q/k RMSNorm per head, grouped-query
attention scaled by query_pre_attn_scalar**-0.5, GELU-tanh gated MLP.
Layers alternate between sliding-window attention (their own rope base) and
global attention (config.layer_types; see causal_lm.py). Embeddings are scaled
by sqrt(hidden_size); the output layer is the embedding table; an optional
tanh soft cap on the final logits. (An attention-score soft cap is refused in
config.py: transformers' Gemma 3 ignores it and llama.cpp refuses it.)
"""
import math

from ... import functional as F
from ...creation import tensor
from ...nn import Embedding, FusedLinear, Linear, Module
from ..architectures import Architecture, refuse, register
from ..attention import activation_op, merge_heads, split_heads
from ..causal_lm import CausalLM
from ..gguf_names import LLAMA_BLOCKS, QK_NORM_BLOCKS


class GemmaRMSNorm(Module):
    """RMSNorm scaling by (offset + weight): HF checkpoints store weight - 1 (offset 1),
    llama.cpp's GGUF files the full scale (offset 0). The sum is taken once, at load."""

    kind = "rms"  # for functional.add_norm_linear
    bias = None

    def __init__(self, vb, dim, cfg):
        w = vb.get((dim,), "weight")
        self.weight = w + cfg.norm_weight_offset if cfg.norm_weight_offset else w
        self.eps = cfg.rms_norm_eps

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)


class Gemma3Attention(Module):
    def __init__(self, vb, cfg):
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v as one matmul over their joined rows, the input norm fused in (add_norm_forward).
        self.qkv_proj = FusedLinear(vb, ["q_proj", "k_proj", "v_proj"], cfg.hidden_size, [h * d, hk * d, hk * d],
                                    bias=cfg.attention_bias)
        self.o_proj = Linear(vb.pp("o_proj"), h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = GemmaRMSNorm(vb.pp("q_norm"), d, cfg)
        self.k_norm = GemmaRMSNorm(vb.pp("k_norm"), d, cfg)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        return self.attend(*self.qkv_proj.parts(x), step, kv_cache)

    def add_norm_forward(self, x, residual, norm, step, kv_cache):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and q/k/v as one op."""
        hidden, (q, k, v) = self.qkv_proj.add_norm_parts(x, residual, norm)
        return hidden, self.attend(q, k, v, step, kv_cache)

    def attend(self, q, k, v, step, kv_cache):
        cfg = self.cfg
        q = self.q_norm(split_heads(q, cfg.num_heads, cfg.head_dim))
        k = self.k_norm(split_heads(k, cfg.num_kv_heads, cfg.head_dim))
        v = split_heads(v, cfg.num_kv_heads, cfg.head_dim)
        if cfg.rotary_dim == cfg.head_dim:  # the rotation inside the one attention op (a captured step's kernel)
            return self.o_proj(merge_heads(step.attend_rotary(q, k, v, kv_cache, cfg.rope_interleaved,
                                                              scale=cfg.attention_scale)))
        q = step.rotate(q, cfg.rotary_dim, cfg.rope_interleaved)
        k = step.rotate(k, cfg.rotary_dim, cfg.rope_interleaved)
        return self.o_proj(merge_heads(step.attend(q, k, v, kv_cache, scale=cfg.attention_scale)))


class Gemma3MLP(Module):
    def __init__(self, vb, cfg):
        size = cfg.intermediate_size
        # gate and up as one matmul with the activation and product fused in (GeGLU).
        self.gate_up_proj = FusedLinear(vb, ["gate_proj", "up_proj"], cfg.hidden_size, [size, size], bias=False)
        self.down_proj = Linear(vb.pp("down_proj"), size, cfg.hidden_size, bias=False)
        self.act = activation_op(cfg.hidden_act)

    def forward(self, x):
        return self.down_proj(self.gate_up_proj.gated(x, self.act))

    def add_norm_forward(self, x, residual, norm):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and gate/up as one op."""
        hidden, gated = self.gate_up_proj.add_norm_gated(x, residual, norm, self.act)
        return hidden, self.down_proj(gated)


class Gemma3Block(Module):
    def __init__(self, vb, cfg):
        norm = lambda name: GemmaRMSNorm(vb.pp(name), cfg.hidden_size, cfg)  # noqa: E731
        self.input_layernorm = norm("input_layernorm")
        self.self_attn = Gemma3Attention(vb.pp("self_attn"), cfg)
        self.post_attention_layernorm = norm("post_attention_layernorm")
        self.pre_feedforward_layernorm = norm("pre_feedforward_layernorm")
        self.mlp = Gemma3MLP(vb.pp("mlp"), cfg)
        self.post_feedforward_layernorm = norm("post_feedforward_layernorm")

    def forward(self, x, step, kv_cache):
        # Each norm before a projection runs inside it (add_norm_linear), the residual add before
        # the MLP's too; the norms after attention and MLP (Gemma's sandwich) stay apart.
        _, attn = self.self_attn.add_norm_forward(x, None, self.input_layernorm, step, kv_cache)
        x, mlp = self.mlp.add_norm_forward(x, self.post_attention_layernorm(attn), self.pre_feedforward_layernorm)
        return x + self.post_feedforward_layernorm(mlp)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        m = vb.pp("model")
        self.embed_tokens = Embedding(m.pp("embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        # transformers rounds the scale to the embedding dtype before multiplying.
        w = self.embed_tokens.weight
        self.embed_scale = tensor(math.sqrt(cfg.hidden_size), w.dtype if w.dtype.is_float else vb.dtype, vb.device)
        self.layers = [Gemma3Block(m.pp(f"layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.norm = GemmaRMSNorm(m.pp("norm"), cfg.hidden_size, cfg)
        if cfg.tie_word_embeddings:
            self.lm_head_weight = self.embed_tokens.weight
        else:
            self.lm_head_weight = vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
        self._finish_init()

    def embed(self, ids):
        return self.embed_tokens(ids) * self.embed_scale

    def final_norm(self, hidden):
        return self.norm(hidden)

    def lm_head(self, hidden):
        logits = F.linear(hidden, self.lm_head_weight)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else (logits * (1.0 / cap)).tanh() * cap


def _gguf_config(g, cfg):
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


# What Gemma 3 configs leave to transformers' defaults: tied embeddings, RMSNorm weights
# stored as offsets from 1, a rope base of 1e6 on global layers and 1e4 on sliding ones,
# every 6th layer global.
CONFIG_DEFAULTS = {"tie_word_embeddings": True, "norm_weight_offset": 1.0, "rope_theta": 1_000_000.0,
                   "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6}
register(Architecture("gemma3_text", Gemma3ForCausalLM, CONFIG_DEFAULTS, gguf_arch="gemma3",
                      gguf_blocks={**LLAMA_BLOCKS, **QK_NORM_BLOCKS,
                                   "post_attention_norm": "post_attention_layernorm",
                                   "ffn_norm": "pre_feedforward_layernorm",
                                   "post_ffw_norm": "post_feedforward_layernorm"},
                      gguf_config=_gguf_config))
refuse("gemma3", "multimodal Gemma 3: tallow runs the text-only gemma3_text checkpoints")  # 4B+ with vision
