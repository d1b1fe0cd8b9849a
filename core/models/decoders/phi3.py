"""Phi-3 / Phi-3.5-mini / Phi-4-mini (transformers' Phi3ForCausalLM).

Llama-like pre-norm blocks with a fused qkv_proj and a fused gate_up_proj,
longrope scaling (short factors up to original_max_position_embeddings, long
factors past it, cos/sin scaled by the attention factor), partial rotary
(Phi-4-mini: 0.75), an optional sliding window and tied embeddings.
"""
from ... import functional as F
from ...nn import Embedding, Linear, Module, RMSNorm
from ..architectures import Architecture, register
from ..attention import activation, apply_rotary, merge_heads, split_heads
from ..causal_lm import CausalLM
from ..gguf_names import ATTENTION_BLOCKS


class Phi3Attention(Module):
    def __init__(self, vb, cfg):
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = Linear(vb.pp("qkv_proj"), cfg.hidden_size, (h + 2 * hk) * d, bias=False)
        self.o_proj = Linear(vb.pp("o_proj"), h * d, cfg.hidden_size, bias=False)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        cfg = self.cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = self.qkv_proj(x)
        q = split_heads(qkv.narrow(-1, 0, q_size), cfg.num_heads, cfg.head_dim)
        k = split_heads(qkv.narrow(-1, q_size, kv_size), cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(qkv.narrow(-1, q_size + kv_size, kv_size), cfg.num_kv_heads, cfg.head_dim)
        q = apply_rotary(q, step.cos, step.sin, cfg.rotary_dim, cfg.rope_interleaved)
        k = apply_rotary(k, step.cos, step.sin, cfg.rotary_dim, cfg.rope_interleaved)
        return self.o_proj(merge_heads(step.attend(q, k, v, kv_cache)))


class Phi3MLP(Module):
    def __init__(self, vb, cfg):
        self.gate_up_proj = Linear(vb.pp("gate_up_proj"), cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(vb.pp("down_proj"), cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)
        self.size = cfg.intermediate_size

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.narrow(-1, 0, self.size), gate_up.narrow(-1, self.size, self.size)
        return self.down_proj(up * self.act(gate))


class Phi3Block(Module):
    def __init__(self, vb, cfg):
        self.input_layernorm = RMSNorm(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Phi3Attention(vb.pp("self_attn"), cfg)
        self.post_attention_layernorm = RMSNorm(vb.pp("post_attention_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Phi3MLP(vb.pp("mlp"), cfg)

    def forward(self, x, step, kv_cache):
        x = x + self.self_attn(self.input_layernorm(x), step, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Phi3ForCausalLM(CausalLM):
    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        m = vb.pp("model")
        self.embed_tokens = Embedding(m.pp("embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        self.layers = [Phi3Block(m.pp(f"layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.norm = RMSNorm(m.pp("norm"), cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.tie_word_embeddings:  # Phi-4-mini
            self.lm_head_weight = self.embed_tokens.weight
        else:
            self.lm_head_weight = vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
        self._finish_init()

    def embed(self, ids):
        return self.embed_tokens(ids)

    def final_norm(self, hidden):
        return self.norm(hidden)

    def lm_head(self, hidden):
        return F.linear(hidden, self.lm_head_weight)


register(Architecture("phi3", Phi3ForCausalLM, gguf_arch="phi3",
                      gguf_blocks={**ATTENTION_BLOCKS, "attn_qkv": "self_attn.qkv_proj",
                                   "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                                   "ffn_up": "mlp.gate_up_proj",
                                   "ffn_down": "mlp.down_proj"}))
