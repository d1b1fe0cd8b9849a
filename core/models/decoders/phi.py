"""Phi-1 / Phi-1.5 / Phi-2 (transformers' PhiForCausalLM).

One LayerNorm per block feeding attention and MLP in parallel
(x + attn(ln(x)) + mlp(ln(x))), partial rotary (partial_rotary_factor of each
head), q/k/v/dense and fc1/fc2 with biases, gelu_new, optional per-head
LayerNorm on q and k (qk_layernorm), a final LayerNorm and an lm_head with bias.
"""
from ... import functional as F
from ...nn import Embedding, LayerNorm, Linear, Module
from ..architectures import GGUF_TOP, Architecture, register
from ..attention import activation, merge_heads, split_heads
from ..causal_lm import CausalLM
from ..gguf_names import ATTENTION_BLOCKS


class PhiAttention(Module):
    def __init__(self, vb, cfg):
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Linear(vb.pp("q_proj"), cfg.hidden_size, h * d)
        self.k_proj = Linear(vb.pp("k_proj"), cfg.hidden_size, hk * d)
        self.v_proj = Linear(vb.pp("v_proj"), cfg.hidden_size, hk * d)
        self.dense = Linear(vb.pp("dense"), h * d, cfg.hidden_size)
        if cfg.qk_layernorm:
            self.q_layernorm = LayerNorm(vb.pp("q_layernorm"), d, cfg.layer_norm_eps)
            self.k_layernorm = LayerNorm(vb.pp("k_layernorm"), d, cfg.layer_norm_eps)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        cfg = self.cfg
        q = split_heads(self.q_proj(x), cfg.num_heads, cfg.head_dim)
        k = split_heads(self.k_proj(x), cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(self.v_proj(x), cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_layernorm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q = step.rotate(q, cfg.rotary_dim, cfg.rope_interleaved)
        k = step.rotate(k, cfg.rotary_dim, cfg.rope_interleaved)
        return self.dense(merge_heads(step.attend(q, k, v, kv_cache)))


class PhiMLP(Module):
    def __init__(self, vb, cfg):
        self.fc1 = Linear(vb.pp("fc1"), cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = Linear(vb.pp("fc2"), cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PhiBlock(Module):
    def __init__(self, vb, cfg):
        self.input_layernorm = LayerNorm(vb.pp("input_layernorm"), cfg.hidden_size, cfg.layer_norm_eps)
        self.self_attn = PhiAttention(vb.pp("self_attn"), cfg)
        self.mlp = PhiMLP(vb.pp("mlp"), cfg)

    def forward(self, x, step, kv_cache):
        h = self.input_layernorm(x)
        return x + self.self_attn(h, step, kv_cache) + self.mlp(h)


class PhiForCausalLM(CausalLM):
    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        m = vb.pp("model")
        self.embed_tokens = Embedding(m.pp("embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        self.layers = [PhiBlock(m.pp(f"layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.final_layernorm = LayerNorm(m.pp("final_layernorm"), cfg.hidden_size, cfg.layer_norm_eps)
        if cfg.tie_word_embeddings:
            self.lm_head_weight = self.embed_tokens.weight
            self.lm_head_bias = vb.get((cfg.vocab_size,), "lm_head.bias") if vb.contains("lm_head.bias") else None
        else:
            self.lm_head_weight = vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
            self.lm_head_bias = vb.get((cfg.vocab_size,), "lm_head.bias")
        self._finish_init()

    def embed(self, ids):
        return self.embed_tokens(ids)

    def final_norm(self, hidden):
        return self.final_layernorm(hidden)

    def lm_head(self, hidden):
        return F.linear(hidden, self.lm_head_weight, self.lm_head_bias)


# PhiConfig's default activation; llama.cpp calls Phi-2 "phi2" and fuses q/k/v into attn_qkv.
register(Architecture("phi", PhiForCausalLM, {"hidden_act": "gelu_new"}, gguf_arch="phi2",
                      gguf_blocks={**ATTENTION_BLOCKS, "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1",
                                   "ffn_down": "mlp.fc2"},
                      gguf_top={**GGUF_TOP, "output_norm": "model.final_layernorm"}, gguf_fused_qkv="attn_qkv"))
