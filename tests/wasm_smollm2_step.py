"""SmolLM2-135M-Instruct Q4_1 decoded by kernels.wasm alone under wasmtime: the model's weights
(as the CPU device loaded them) placed in the module's memory, one decode step recorded once as a
program of kernel calls (embedding row to logits), each step one `run` call. For
tests/test_wasm_smollm2.py and bench/wasm_step.py; needs numpy, wasmtime and a built kernels.wasm.
"""
import math
import os

import numpy as np

from tallow.backends.wasm.kernels_ir import BLOCK_BYTES
from tallow.backends.wasm.program import StepArg, encode, step_words

MODEL = os.path.join(os.environ.get("TALLOW_HOME", os.path.expanduser("~/.cache/tallow")),
                     "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
CAPACITY = 128  # KV-cache slots: the prompt and the decoded tokens


def cpu_greedy(model, prompt, tokens, rows=8):
    """The CPU device's greedy ids (as generate_ids gives them: stopping before an end token) with
    the prompt read `rows` tokens at a time: its decode-step kernels quantise activations to
    int16 as kernels.wasm's products do, where a longer prompt's products take int8 activation
    tiles (cpu/kernels/int_tiles.py) whose rounding can change a greedy pick."""
    import tallow
    cache = model.new_cache()
    for i in range(0, len(prompt), rows):
        logits = model(tallow.tensor([prompt[i:i + rows]], tallow.i64, model.device), cache=cache, last_only=True)
    ids = []
    while len(ids) < tokens:
        token = int(logits.argmax().item())
        if token in model.eos_token_ids:
            break
        ids.append(token)
        logits = model.forward([token], cache=cache, last_only=True)
    return ids


class WasmSmolLM2:
    """The model's weights placed in the module's memory, and one decode step as a program."""

    def __init__(self, model, wasm):
        self.cfg = cfg = model.config
        self.wasm = wasm
        d, hd = cfg.hidden_size, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.embed = self._quant(model.embed_tokens.weight)
        self.head = self.embed if cfg.tie_word_embeddings else self._quant(model.lm_head_weight)
        self.layers = [dict(norm_in=self._f32(block.input_layernorm.weight), qkv=self._quant(block.self_attn.qkv_proj.weight),
                            o=self._quant(block.self_attn.o_proj.weight),
                            norm_post=self._f32(block.post_attention_layernorm.weight),
                            gate_up=self._quant(block.mlp.gate_up_proj.weight), down=self._quant(block.mlp.down_proj.weight),
                            kc=wasm.alloc(cfg.num_kv_heads * CAPACITY * hd * 4),
                            vc=wasm.alloc(cfg.num_kv_heads * CAPACITY * hd * 4)) for block in model.layers]
        self.norm = self._f32(model.norm.weight)
        inv = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        angles = np.arange(CAPACITY)[:, None] * inv[None, :]
        self.cos, self.sin = wasm.put(np.cos(angles).astype(np.float32)), wasm.put(np.sin(angles).astype(np.float32))
        widest = max(d, cfg.intermediate_size)
        self.h, self.zero, self.total, self.normed = (wasm.alloc(d * 4) for _ in range(4))
        self.qkv = wasm.alloc((cfg.num_heads + 2 * cfg.num_kv_heads) * hd * 4)
        self.att, self.o = wasm.alloc(cfg.num_heads * hd * 4), wasm.alloc(d * 4)
        self.gu, self.act = wasm.alloc(2 * cfg.intermediate_size * 4), wasm.alloc(cfg.intermediate_size * 4)
        self.qx, self.dx, self.sx = wasm.alloc(widest * 2), wasm.alloc(widest // 8), wasm.alloc(widest // 8)
        self.scores = wasm.alloc(CAPACITY * 4)
        self.logits = wasm.alloc(cfg.vocab_size * 4)
        self.step_at = wasm.alloc(8)
        self.record()

    def _quant(self, t):
        rows, cols = t.shape
        return dict(at=self.wasm.put(np.frombuffer(bytes(t), np.uint8)), fmt=t.dtype.name, rows=rows, cols=cols,
                    row_bytes=len(bytes(t)) // rows)

    def _f32(self, t):
        return self.wasm.put(np.asarray(t.tolist(), np.float32))

    def _product(self, calls, w, x, out):
        k = w["cols"]
        calls.append(("quantize_row", (x, k, self.qx, self.dx, self.sx)))
        calls.append((f"matmul_{w['fmt']}", (w["at"], w["rows"], w["row_bytes"] // BLOCK_BYTES[w["fmt"]], 1,
                                            self.qx, self.dx, self.sx, self.wasm.table, out)))

    def step_calls(self):
        """One token, embedding row to logits, as (kernel, args) calls: what moves with the step
        (the embedding row, the rotary row, the KV slots, the key count) as StepArgs."""
        cfg, hd, d = self.cfg, self.cfg.head_dim, self.cfg.hidden_size
        e = self.embed
        calls = [(f"dequant_{e['fmt']}", (StepArg(e["at"], e["row_bytes"], "token"),
                                          e["row_bytes"] // BLOCK_BYTES[e["fmt"]], self.wasm.table, self.h))]
        cos, sin = StepArg(self.cos, hd // 2 * 4), StepArg(self.sin, hd // 2 * 4)
        q, k = self.qkv, self.qkv + cfg.num_heads * hd * 4
        v = k + cfg.num_kv_heads * hd * 4
        for layer in self.layers:
            calls.append(("add_rms_norm", (self.h, self.zero, layer["norm_in"], d, self.eps, self.total, self.normed)))
            self._product(calls, layer["qkv"], self.normed, self.qkv)
            calls.append(("rope", (q, cfg.num_heads, hd, cos, sin, int(cfg.rope_interleaved))))
            calls.append(("rope", (k, cfg.num_kv_heads, hd, cos, sin, int(cfg.rope_interleaved))))
            for g in range(cfg.num_kv_heads):
                slot = g * CAPACITY * hd * 4
                calls.append(("copy_f32", (k + g * hd * 4, hd, StepArg(layer["kc"] + slot, hd * 4))))
                calls.append(("copy_f32", (v + g * hd * 4, hd, StepArg(layer["vc"] + slot, hd * 4))))
            calls.append(("cache_attention", (q, cfg.num_heads, cfg.num_kv_heads, hd, layer["kc"], layer["vc"], CAPACITY,
                                              StepArg(1, 1), 1 / math.sqrt(hd), self.scores, self.att)))
            self._product(calls, layer["o"], self.att, self.o)
            calls.append(("add_rms_norm", (self.h, self.o, layer["norm_post"], d, self.eps, self.h, self.normed)))
            self._product(calls, layer["gate_up"], self.normed, self.gu)
            calls.append(("silu_mul", (self.gu, self.gu + cfg.intermediate_size * 4, cfg.intermediate_size, self.act)))
            self._product(calls, layer["down"], self.act, self.o)
            calls.append(("add_f32", (self.h, self.o, d, self.h)))
        calls.append(("add_rms_norm", (self.h, self.zero, self.norm, d, self.eps, self.total, self.normed)))
        self._product(calls, self.head, self.normed, self.logits)
        return calls

    def prefill_calls(self, tokens, first=0):
        """A prompt's tokens at positions first.. as one program: each product once over all t rows
        (the weights read once), the rest row by row with the decode kernels; (calls, the logits
        of the last token's address). Fresh buffers per prompt (the bump allocator keeps them)."""
        cfg, hd, d, w = self.cfg, self.cfg.head_dim, self.cfg.hidden_size, self.wasm
        t, size, e = len(tokens), cfg.intermediate_size, self.embed
        width = (cfg.num_heads + 2 * cfg.num_kv_heads) * hd
        h, total, normed, o = (w.alloc(t * d * 4) for _ in range(4))
        qkv, att = w.alloc(t * width * 4), w.alloc(t * cfg.num_heads * hd * 4)
        gu, act = w.alloc(t * 2 * size * 4), w.alloc(t * size * 4)
        qx, dx, sx = w.alloc(t * size * 2), w.alloc(t * size // 8), w.alloc(t * size // 8)
        rows = range(t)

        def product(calls, weight, x, out):
            k = weight["cols"]
            for i in rows:
                calls.append(("quantize_row", (x + i * k * 4, k, qx + i * k * 2, dx + i * k // 8, sx + i * k // 8)))
            calls.append((f"matmul_{weight['fmt']}", (weight["at"], weight["rows"], weight["row_bytes"] // BLOCK_BYTES[weight["fmt"]],
                                                     t, qx, dx, sx, w.table, out)))
        calls = [(f"dequant_{e['fmt']}", (e["at"] + token * e["row_bytes"], e["row_bytes"] // BLOCK_BYTES[e["fmt"]],
                                          w.table, h + i * d * 4)) for i, token in enumerate(tokens)]
        for layer in self.layers:
            for i in rows:
                calls.append(("add_rms_norm", (h + i * d * 4, self.zero, layer["norm_in"], d, self.eps, total + i * d * 4,
                                               normed + i * d * 4)))
            product(calls, layer["qkv"], normed, qkv)
            for i in rows:
                pos, q = first + i, qkv + i * width * 4
                k = q + cfg.num_heads * hd * 4
                v = k + cfg.num_kv_heads * hd * 4
                cos, sin = self.cos + pos * hd // 2 * 4, self.sin + pos * hd // 2 * 4
                calls.append(("rope", (q, cfg.num_heads, hd, cos, sin, int(cfg.rope_interleaved))))
                calls.append(("rope", (k, cfg.num_kv_heads, hd, cos, sin, int(cfg.rope_interleaved))))
                for g in range(cfg.num_kv_heads):
                    slot = (g * CAPACITY + pos) * hd * 4
                    calls.append(("copy_f32", (k + g * hd * 4, hd, layer["kc"] + slot)))
                    calls.append(("copy_f32", (v + g * hd * 4, hd, layer["vc"] + slot)))
            for i in rows:  # after every token's slots are written; token i sees the first first + i + 1
                calls.append(("cache_attention", (qkv + i * width * 4, cfg.num_heads, cfg.num_kv_heads, hd, layer["kc"],
                                                  layer["vc"], CAPACITY, first + i + 1, 1 / math.sqrt(hd), self.scores,
                                                  att + i * cfg.num_heads * hd * 4)))
            product(calls, layer["o"], att, o)
            for i in rows:
                calls.append(("add_rms_norm", (h + i * d * 4, o + i * d * 4, layer["norm_post"], d, self.eps,
                                               h + i * d * 4, normed + i * d * 4)))
            product(calls, layer["gate_up"], normed, gu)
            for i in rows:
                calls.append(("silu_mul", (gu + i * 2 * size * 4, gu + (i * 2 + 1) * size * 4, size, act + i * size * 4)))
            product(calls, layer["down"], act, o)
            for i in rows:
                calls.append(("add_f32", (h + i * d * 4, o + i * d * 4, d, h + i * d * 4)))
        last = h + (t - 1) * d * 4
        calls.append(("add_rms_norm", (last, self.zero, self.norm, d, self.eps, self.total, self.normed)))
        self._product(calls, self.head, self.normed, self.logits)
        return calls

    def prefill(self, tokens):
        """The last prompt token's logits: the prompt's program written, then one `run` call."""
        words, count = encode(self.prefill_calls(tokens))
        self.wasm("run", self.wasm.put(np.frombuffer(words.tobytes(), np.int32)), count, self.step_at)
        return self.wasm.get(self.logits, (self.cfg.vocab_size,), np.float32)

    def record(self):
        """The step's program, written into the memory once (as a capture records a step)."""
        words, self.count = encode(self.step_calls())
        self.program = self.wasm.put(np.frombuffer(words.tobytes(), np.int32))

    def step(self, token, pos):
        """Logits after `token` at `pos`: the step words written, then one `run` call (a replay)."""
        self.wasm.memory.write(self.wasm.store, step_words(pos, token), self.step_at)
        self.wasm("run", self.program, self.count, self.step_at)
        return self.wasm.get(self.logits, (self.cfg.vocab_size,), np.float32)
