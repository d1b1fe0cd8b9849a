"""Phi-3 / Phi-3.5-mini / Phi-4-mini (transformers' Phi3ForCausalLM).

Llama-like pre-norm blocks with a fused qkv_proj and a fused gate_up_proj,
longrope scaling (short factors up to original_max_position_embeddings, long
factors past it, cos/sin scaled by the attention factor), partial rotary
(Phi-4-mini: 0.75), an optional sliding window and tied embeddings.
"""
from ... import functional as F
from ...nn import Linear, Module, RMSNorm
from ..architectures import Architecture, register
from ..attention import activation_op, merge_heads, split_heads
from ..gguf_names import ATTENTION_BLOCKS
from .llama import LlamaBlock, LlamaForCausalLM


class Phi3Attention(Module):
    def __init__(self, vb, cfg):
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = Linear(vb.pp("qkv_proj"), cfg.hidden_size, (h + 2 * hk) * d, bias=False)
        self.o_proj = Linear(vb.pp("o_proj"), h * d, cfg.hidden_size, bias=False)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        return self.attend(self.qkv_proj(x), step, kv_cache)

    def add_norm_forward(self, x, residual, norm, step, kv_cache):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and qkv_proj as one op."""
        hidden, qkv = self.qkv_proj.add_norm(x, residual, norm)
        return hidden, self.attend(qkv, step, kv_cache)

    def attend(self, qkv, step, kv_cache):
        cfg = self.cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q = split_heads(qkv.narrow(-1, 0, q_size), cfg.num_heads, cfg.head_dim)
        k = split_heads(qkv.narrow(-1, q_size, kv_size), cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(qkv.narrow(-1, q_size + kv_size, kv_size), cfg.num_kv_heads, cfg.head_dim)
        if cfg.rotary_dim == cfg.head_dim:
            return self.o_proj(merge_heads(step.attend_rotary(q, k, v, kv_cache, cfg.rope_interleaved)))
        q = step.rotate(q, cfg.rotary_dim, cfg.rope_interleaved)  # Phi-4-mini's partial rotary
        k = step.rotate(k, cfg.rotary_dim, cfg.rope_interleaved)
        return self.o_proj(merge_heads(step.attend(q, k, v, kv_cache)))


class Phi3MLP(Module):
    def __init__(self, vb, cfg):
        self.gate_up_proj = Linear(vb.pp("gate_up_proj"), cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(vb.pp("down_proj"), cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation_op(cfg.hidden_act)

    def forward(self, x):
        # The checkpoint's gate_up rows are [gate; up] already: one gated projection.
        return self.down_proj(F.gated_linear(x, self.gate_up_proj.weight, self.act))

    def add_norm_forward(self, x, residual, norm):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and gate/up as one op."""
        hidden, gated = F.add_norm_linear(x, residual, norm.weight, None, self.gate_up_proj.weight, None, "rms",
                                          norm.eps, self.act, gated=True)
        return hidden, self.down_proj(gated)


class Phi3Block(LlamaBlock):
    """Llama's block (residual adds fused into the next norm) with Phi-3's attention and MLP."""

    def __init__(self, vb, cfg):
        self.input_layernorm = RMSNorm(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Phi3Attention(vb.pp("self_attn"), cfg)
        self.post_attention_layernorm = RMSNorm(vb.pp("post_attention_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Phi3MLP(vb.pp("mlp"), cfg)


class Phi3ForCausalLM(LlamaForCausalLM):
    block = Phi3Block


register(Architecture("phi3", Phi3ForCausalLM, gguf_arch="phi3",
                      gguf_blocks={**ATTENTION_BLOCKS, "attn_qkv": "self_attn.qkv_proj",
                                   "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                                   "ffn_up": "mlp.gate_up_proj",
                                   "ffn_down": "mlp.down_proj"}))
