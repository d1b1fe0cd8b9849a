"""Llama-family decoders: Llama 2/3/3.2, SmolLM/SmolLM2, TinyLlama, Qwen2/2.5, Qwen3.

Pre-norm blocks (RMSNorm), grouped-query attention with rotary embeddings
(plain, linear or llama3 scaling), SwiGLU MLP. Qwen2 adds q/k/v biases; Qwen3
instead normalises each q/k head (RMSNorm) before the rotary embedding.
Weight names are the Hugging Face checkpoint's (model.layers.N.self_attn.q_proj...).
"""
from ... import functional as F
from ...nn import Embedding, Linear, Module, RMSNorm
from ..architectures import Architecture, register
from ..attention import activation, apply_rotary, merge_heads, split_heads
from ..causal_lm import CausalLM
from ..gguf_names import LLAMA_BLOCKS, QK_NORM_BLOCKS


class LlamaAttention(Module):
    def __init__(self, vb, cfg):
        qkv_bias = cfg.qkv_bias
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Linear(vb.pp("q_proj"), cfg.hidden_size, h * d, bias=qkv_bias)
        self.k_proj = Linear(vb.pp("k_proj"), cfg.hidden_size, hk * d, bias=qkv_bias)
        self.v_proj = Linear(vb.pp("v_proj"), cfg.hidden_size, hk * d, bias=qkv_bias)
        self.o_proj = Linear(vb.pp("o_proj"), h * d, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(vb.pp("q_norm"), d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(vb.pp("k_norm"), d, cfg.rms_norm_eps)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        cfg = self.cfg
        q = split_heads(self.q_proj(x), cfg.num_heads, cfg.head_dim)
        k = split_heads(self.k_proj(x), cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(self.v_proj(x), cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, step.cos, step.sin, cfg.rotary_dim, cfg.rope_interleaved)
        k = apply_rotary(k, step.cos, step.sin, cfg.rotary_dim, cfg.rope_interleaved)
        return self.o_proj(merge_heads(step.attend(q, k, v, kv_cache)))


class LlamaMLP(Module):
    def __init__(self, vb, cfg):
        self.gate_proj = Linear(vb.pp("gate_proj"), cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = Linear(vb.pp("up_proj"), cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(vb.pp("down_proj"), cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = activation(cfg.hidden_act)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(Module):
    def __init__(self, vb, cfg):
        self.input_layernorm = RMSNorm(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(vb.pp("self_attn"), cfg)
        self.post_attention_layernorm = RMSNorm(vb.pp("post_attention_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(vb.pp("mlp"), cfg)

    def forward(self, x, step, kv_cache):
        x = x + self.self_attn(self.input_layernorm(x), step, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(CausalLM):
    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        m = vb.pp("model")
        self.embed_tokens = Embedding(m.pp("embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        self.layers = [LlamaBlock(m.pp(f"layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.norm = RMSNorm(m.pp("norm"), cfg.hidden_size, cfg.rms_norm_eps)
        # Tied checkpoints (SmolLM2, small Qwen2) reuse the embedding table as the output layer.
        if cfg.tie_word_embeddings:
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


def _interleaved_rope(fields, config):
    # llama.cpp's converter permutes the rows of attn_q/attn_k inside each head (HF's
    # half-split rotary -> ggml's interleaved pairs). The same per-head permutation of q
    # and k leaves q.k unchanged, so instead of un-permuting (quantised) rows the model
    # rotates interleaved pairs.
    return {"rope_interleaved": True}


register(Architecture("llama", LlamaForCausalLM, gguf_arch="llama", gguf_blocks=LLAMA_BLOCKS,
                      gguf_config=_interleaved_rope))
register(Architecture("qwen2", LlamaForCausalLM, {"qkv_bias": True}, gguf_arch="qwen2", gguf_blocks=LLAMA_BLOCKS))
register(Architecture("qwen3", LlamaForCausalLM, {"qk_norm": True}, gguf_arch="qwen3",
                      gguf_blocks={**LLAMA_BLOCKS, **QK_NORM_BLOCKS}))
