"""kernels.wasm has everything a SmolLM2 decode step needs: SmolLM2-135M-Instruct Q4_1 decoded
greedily, every token one `run` call of one program (embedding row to logits, all 30 layers),
natively under wasmtime, gives the CPU device's greedy ids.

This is the kernel set's proof for issue 31, not the wasm device: the device (docs/wasm.md,
"The device design") records the same calls from the model's own ops. Here the program is
written out from the model's weights, which the CPU device loads. The prompt is read one token
at a time, since the module has no many-token attention yet.
"""
import math
import os

import numpy as np
import pytest

import tallow

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.kernels_ir import BLOCK_BYTES  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402
from tallow.backends.wasm.program import encode  # noqa: E402

pytestmark = pytest.mark.models

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)

MODEL = os.path.join(os.environ.get("TALLOW_HOME", os.path.expanduser("~/.cache/tallow")),
                     "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
CAPACITY = 64  # KV-cache slots: the prompt and the decoded tokens


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
        self.program = wasm.alloc(1 << 16)

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

    def step_calls(self, token, pos):
        """One token at position pos, embedding row to logits, as (kernel, args) calls."""
        cfg, hd, d = self.cfg, self.cfg.head_dim, self.cfg.hidden_size
        e = self.embed
        calls = [(f"dequant_{e['fmt']}", (e["at"] + token * e["row_bytes"], e["row_bytes"] // BLOCK_BYTES[e["fmt"]],
                                          self.wasm.table, self.h))]
        cos, sin = self.cos + pos * hd // 2 * 4, self.sin + pos * hd // 2 * 4
        q, k = self.qkv, self.qkv + cfg.num_heads * hd * 4
        v = k + cfg.num_kv_heads * hd * 4
        for layer in self.layers:
            calls.append(("add_rms_norm", (self.h, self.zero, layer["norm_in"], d, self.eps, self.total, self.normed)))
            self._product(calls, layer["qkv"], self.normed, self.qkv)
            calls.append(("rope", (q, cfg.num_heads, hd, cos, sin, int(cfg.rope_interleaved))))
            calls.append(("rope", (k, cfg.num_kv_heads, hd, cos, sin, int(cfg.rope_interleaved))))
            for g in range(cfg.num_kv_heads):
                slot = ((g * CAPACITY) + pos) * hd * 4
                calls.append(("copy_f32", (k + g * hd * 4, hd, layer["kc"] + slot)))
                calls.append(("copy_f32", (v + g * hd * 4, hd, layer["vc"] + slot)))
            calls.append(("cache_attention", (q, cfg.num_heads, cfg.num_kv_heads, hd, layer["kc"], layer["vc"], CAPACITY,
                                              pos + 1, 1 / math.sqrt(hd), self.scores, self.att)))
            self._product(calls, layer["o"], self.att, self.o)
            calls.append(("add_rms_norm", (self.h, self.o, layer["norm_post"], d, self.eps, self.h, self.normed)))
            self._product(calls, layer["gate_up"], self.normed, self.gu)
            calls.append(("silu_mul", (self.gu, self.gu + cfg.intermediate_size * 4, cfg.intermediate_size, self.act)))
            self._product(calls, layer["down"], self.act, self.o)
            calls.append(("add_f32", (self.h, self.o, d, self.h)))
        calls.append(("add_rms_norm", (self.h, self.zero, self.norm, d, self.eps, self.total, self.normed)))
        self._product(calls, self.head, self.normed, self.logits)
        return calls

    def step(self, token, pos):
        """Logits after `token` at `pos`: the program written into the memory, then one `run` call."""
        words, count = encode(self.step_calls(token, pos))
        self.wasm.memory.write(self.wasm.store, words.tobytes(), self.program)
        self.wasm("run", self.program, count)
        return self.wasm.get(self.logits, (self.cfg.vocab_size,), np.float32)


@pytest.fixture(scope="module")
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    return tallow.load_model(MODEL, device="cpu")


def test_smollm2_greedy_ids_from_kernels_wasm_equal_the_cpu_device(model):
    from tallow.generation import chat_prompt_ids
    from tallow.generation.decoding import generate_ids
    assert not model.config.rope_scaling  # plain rotary tables below
    prompt = chat_prompt_ids(model, [{"role": "user", "content": "What is the capital of France?"}])
    want = list(generate_ids(model, list(prompt), max_tokens=12))
    assert len(prompt) + len(want) <= CAPACITY
    runner = WasmSmolLM2(model, Kernels(build.build()))
    got = []
    for pos, token in enumerate(prompt):
        logits = runner.step(token, pos)
    for pos in range(len(prompt), len(prompt) + len(want)):
        got.append(int(np.argmax(logits)))
        if len(got) == len(want):
            break
        logits = runner.step(got[-1], pos)
    assert got == want, (got, want)
    assert np.all(np.isfinite(logits))


def test_a_step_is_one_run_call(model, monkeypatch):
    """Python calls the module once per token (the program's words are written, then `run`)."""
    runner = WasmSmolLM2(model, Kernels(build.build()))
    calls = []
    original = Kernels.__call__
    monkeypatch.setattr(Kernels, "__call__", lambda self, name, *args: calls.append(name) or original(self, name, *args))
    runner.step(1, 0)
    assert calls == ["run"]
    assert len(runner.step_calls(1, 0)) == 1 + 30 * 21 + 3  # what that one call ran
