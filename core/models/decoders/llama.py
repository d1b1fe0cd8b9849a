"""Llama-family decoders: Llama 2/3/3.2, SmolLM/SmolLM2, TinyLlama, Qwen2/2.5, Qwen3.

Pre-norm blocks (RMSNorm), grouped-query attention with rotary embeddings
(plain, linear or llama3 scaling), SwiGLU MLP. Qwen2 adds q/k/v biases; Qwen3
instead normalises each q/k head (RMSNorm) before the rotary embedding.
Weight names are the Hugging Face checkpoint's (model.layers.N.self_attn.q_proj...).
"""
from ... import functional as F
from ...nn import Embedding, FusedLinear, Linear, Module, RMSNorm
from ..architectures import Architecture, register
from ..attention import activation_op, merge_heads, split_heads
from ..causal_lm import CausalLM
from ..gguf_names import LLAMA_BLOCKS, QK_NORM_BLOCKS


class LlamaAttention(Module):
    def __init__(self, vb, cfg):
        h, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v as one matmul over their joined rows (and biases: Qwen2).
        self.qkv_proj = FusedLinear(vb, ["q_proj", "k_proj", "v_proj"], cfg.hidden_size, [h * d, hk * d, hk * d],
                                    bias=cfg.qkv_bias)
        self.o_proj = Linear(vb.pp("o_proj"), h * d, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(vb.pp("q_norm"), d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(vb.pp("k_norm"), d, cfg.rms_norm_eps)
        self.cfg = cfg

    def forward(self, x, step, kv_cache):
        return self.attend(*self.qkv_proj.parts(x), step, kv_cache)

    def add_norm_forward(self, x, residual, norm, step, kv_cache):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and q/k/v as one op."""
        hidden, (q, k, v) = self.qkv_proj.add_norm_heads(x, residual, norm, self.cfg.head_dim)
        return hidden, self.attend_heads(q, k, v, step, kv_cache)

    def attend(self, q, k, v, step, kv_cache):
        """o_proj(attention) from the q, k and v projections (..., features)."""
        cfg = self.cfg
        return self.attend_heads(split_heads(q, cfg.num_heads, cfg.head_dim),
                                 split_heads(k, cfg.num_kv_heads, cfg.head_dim),
                                 split_heads(v, cfg.num_kv_heads, cfg.head_dim), step, kv_cache)

    def attend_heads(self, q, k, v, step, kv_cache):
        """o_proj(attention) from q (b, heads, t, head_dim), k and v (b, kv_heads, t, head_dim)."""
        cfg = self.cfg
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.rotary_dim == cfg.head_dim:
            out = step.attend_rotary(q, k, v, kv_cache, cfg.rope_interleaved)
        else:
            q = step.rotate(q, cfg.rotary_dim, cfg.rope_interleaved)
            k = step.rotate(k, cfg.rotary_dim, cfg.rope_interleaved)
            out = step.attend(q, k, v, kv_cache)
        return self.o_proj(merge_heads(out))


class LlamaMLP(Module):
    def __init__(self, vb, cfg):
        size = cfg.intermediate_size
        # gate and up as one matmul with the activation and product fused in (SwiGLU).
        self.gate_up_proj = FusedLinear(vb, ["gate_proj", "up_proj"], cfg.hidden_size, [size, size],
                                        bias=cfg.mlp_bias)
        self.down_proj = Linear(vb.pp("down_proj"), size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = activation_op(cfg.hidden_act)

    def forward(self, x):
        return self.down_proj(self.gate_up_proj.gated(x, self.act))

    def add_norm_forward(self, x, residual, norm):
        """(hidden, self(norm(hidden))) with hidden = x + residual: the add, the norm and gate/up as one op."""
        hidden, gated = self.gate_up_proj.add_norm_gated(x, residual, norm, self.act)
        return hidden, self.down_proj(gated)


class LlamaBlock(Module):
    def __init__(self, vb, cfg):
        self.input_layernorm = RMSNorm(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(vb.pp("self_attn"), cfg)
        self.post_attention_layernorm = RMSNorm(vb.pp("post_attention_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(vb.pp("mlp"), cfg)

    def forward(self, x, step, kv_cache):
        hidden, pending = self.forward_fused(x, None, step, kv_cache)
        return hidden + pending

    def forward_fused(self, x, pending, step, kv_cache):
        """(hidden, addend) with the block's output hidden + addend: each residual add runs
        fused with the norm after it and the projection that reads it (add_norm_forward:
        functional.add_norm_linear), the last add in the next block."""
        hidden, attn = self.self_attn.add_norm_forward(x, pending, self.input_layernorm, step, kv_cache)
        return self.mlp.add_norm_forward(hidden, attn, self.post_attention_layernorm)


class LlamaForCausalLM(CausalLM):
    block = LlamaBlock  # Phi-3 reuses the model with its own block

    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        m = vb.pp("model")
        self.embed_tokens = Embedding(m.pp("embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        self.layers = [self.block(m.pp(f"layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.norm = RMSNorm(m.pp("norm"), cfg.hidden_size, cfg.rms_norm_eps)
        # Tied checkpoints (SmolLM2, small Qwen2, Phi-4-mini) reuse the embedding table as the output layer.
        if cfg.tie_word_embeddings:
            self.lm_head_weight = self.embed_tokens.weight
        else:
            self.lm_head_weight = vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
        self._finish_init()

    def embed(self, ids):
        return self.embed_tokens(ids)

    def final_norm(self, hidden):
        return self.norm(hidden)

    def run_layers(self, hidden, steps, cache):
        pending = None
        for layer, step, kv in zip(self.layers, steps, cache.layers):
            hidden, pending = layer.forward_fused(hidden, pending, step, kv)
        return hidden, pending

    def final_add_norm(self, hidden, pending):
        if pending is None:
            return self.norm(hidden)
        return F.add_rms_norm(hidden, pending, self.norm.weight, self.norm.eps)[1]

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
