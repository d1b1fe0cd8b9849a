"""Whisper's audio encoder run by kernels.wasm alone under wasmtime: the checkpoint's f16 weights
placed in the module's memory as they are, and the whole encoder, log-mel to the final LayerNorm,
written out as one program of kernel calls run by one `run` call. For
tests/test_wasm_whisper_encoder.py and bench/wasm_gemm.py; needs numpy, safetensors, wasmtime
and a built kernels.wasm.

The calls: conv1d_f32 twice (f16 weights widened once by f16_to_f32), gelu, the transposed
convolution output plus the positions by one strided binary_f32, then per layer layer_norm_rows,
q/k/v by gemm_f16 (the weights widened inside the GEMM's panels), V transposed by a strided
unary_f32 (affine 1, 0: a copy), per head the scores by gemm_f32, softmax_rows with the head's
scale, the values by gemm_f32 into the head's columns, the output product, add_f32, the MLP
(gemm_f16, gelu, gemm_f16), add_f32; then the final layer_norm_rows.
"""
import json
import os

import numpy as np

from tallow.backends.wasm.program import (BINARY_OPS, STRIDED_DIMS, UNARY_OPS, conv1d_scratch_floats, encode,
                                          gemm_scratch_floats)
from tallow.layout import Layout, kernel_meta

MODEL_DIR = os.path.join(os.environ.get("TALLOW_HOME", os.path.expanduser("~/.cache/tallow")), "whisper-tiny.en")


class WasmWhisperEncoder:
    """The encoder's weights in the module's memory and its forward pass as one program."""

    def __init__(self, model_dir, wasm):
        from safetensors.numpy import load_file
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.wasm = wasm
        self.d, self.heads = cfg["d_model"], cfg["encoder_attention_heads"]
        self.mels, self.ffn = cfg["num_mel_bins"], cfg["encoder_ffn_dim"]
        self.t = cfg["max_source_positions"]  # positions after the stride-2 convolution
        tensors = load_file(os.path.join(model_dir, "model.safetensors"))
        self.w = {name[len("model.encoder."):]: wasm.put(value.astype(np.float16)) for name, value in tensors.items()
                  if name.startswith("model.encoder.")}
        self.sizes = {name[len("model.encoder."):]: value.size for name, value in tensors.items()
                      if name.startswith("model.encoder.")}
        self.layers = cfg["encoder_layers"]
        # every non-matrix tensor (conv weights, biases, norms, positions) widened to f32 once, in wasm
        self.f32 = {name: wasm.alloc(n * 4) for name, n in self.sizes.items() if not _is_matrix(name)}
        self.widen = encode([("f16_to_f32", (self.w[name], self.sizes[name], at)) for name, at in self.f32.items()])
        d, t, frames = self.d, self.t, 2 * self.t
        self.mel = wasm.alloc(self.mels * frames * 4)
        self.c1, self.c2 = wasm.alloc(d * frames * 4), wasm.alloc(d * t * 4)
        self.h, self.x, self.q, self.k, self.v, self.vt, self.o, self.a = (wasm.alloc(t * d * 4) for _ in range(8))
        self.f = wasm.alloc(t * self.ffn * 4)
        self.s = wasm.alloc(t * t * 4)
        self.out = wasm.alloc(t * d * 4)
        self.scratch = wasm.alloc(4 * max(conv1d_scratch_floats(self.mels, frames, 3),
                                          conv1d_scratch_floats(d, t, 3),
                                          gemm_scratch_floats(max(d, self.ffn, t))))
        self.program = encode(self.calls())
        self.programs = [(wasm.put(np.asarray(words, np.int32)), count) for words, count in (self.widen, self.program)]
        wasm("run", *self.programs[0], 0)

    def _meta(self, shape, *layouts):
        return self.wasm.put(np.array(kernel_meta(shape, list(layouts), STRIDED_DIMS), np.int32))

    def calls(self):
        d, t, frames, hd = self.d, self.t, 2 * self.t, self.d // self.heads
        f32, w, scratch = self.f32, self.w, self.scratch
        c = [("conv1d_f32", (self.mel, self.mels, frames, f32["conv1.weight"], d, 3, 1, 1, f32["conv1.bias"], self.c1,
                             scratch)),
             ("gelu", (self.c1, d * frames, self.c1)),
             ("conv1d_f32", (self.c1, d, frames, f32["conv2.weight"], d, 3, 2, 1, f32["conv2.bias"], self.c2, scratch)),
             ("gelu", (self.c2, d * t, self.c2)),
             # (d, t) read as (t, d), plus the positions: h (t, d)
             ("binary_f32", (BINARY_OPS["add"], self.c2, f32["embed_positions.weight"], self.h,
                             self._meta((t, d), Layout((t, d), (1, t)), Layout((t, d)))))]
        v_heads = self._meta((self.heads, hd, t), Layout((self.heads, hd, t), (hd, 1, d)))

        def gemm16(x, k, name, n, out):
            bias = f32.get(f"{name}.bias", 0)
            return ("gemm_f16", (x, k, w[f"{name}.weight"], k, bias, out, n, t, n, k, scratch))
        for i in range(self.layers):
            p = f"layers.{i}."
            c += [("layer_norm_rows", (self.h, t, d, f32[p + "self_attn_layer_norm.weight"],
                                       f32[p + "self_attn_layer_norm.bias"], 1e-5, self.x)),
                  gemm16(self.x, d, p + "self_attn.q_proj", d, self.q),
                  gemm16(self.x, d, p + "self_attn.k_proj", d, self.k),
                  gemm16(self.x, d, p + "self_attn.v_proj", d, self.v),
                  ("unary_f32", (UNARY_OPS["affine"], self.v, self.vt, v_heads, 1.0, 0.0))]  # (heads, hd, t)
            for h in range(self.heads):
                c += [("gemm_f32", (self.q + 4 * h * hd, d, self.k + 4 * h * hd, d, 0, self.s, t, t, t, hd, scratch)),
                      ("softmax_rows", (self.s, t, t, t, hd ** -0.5, -1, self.s)),
                      ("gemm_f32", (self.s, t, self.vt + 4 * h * hd * t, t, 0, self.o + 4 * h * hd, d, t, hd, t,
                                    scratch))]
            c += [gemm16(self.o, d, p + "self_attn.out_proj", d, self.a),
                  ("add_f32", (self.h, self.a, t * d, self.h)),
                  ("layer_norm_rows", (self.h, t, d, f32[p + "final_layer_norm.weight"],
                                       f32[p + "final_layer_norm.bias"], 1e-5, self.x)),
                  gemm16(self.x, d, p + "fc1", self.ffn, self.f),
                  ("gelu", (self.f, t * self.ffn, self.f)),
                  gemm16(self.f, self.ffn, p + "fc2", d, self.a),
                  ("add_f32", (self.h, self.a, t * d, self.h))]
        c.append(("layer_norm_rows", (self.h, t, d, f32["layer_norm.weight"], f32["layer_norm.bias"], 1e-5, self.out)))
        return c

    def __call__(self, mel):
        """mel (num_mel_bins, 2 * max_source_positions) float32 -> the encoder's output (t, d)."""
        wasm = self.wasm
        wasm.memory.write(wasm.store, np.ascontiguousarray(mel, np.float32).tobytes(), self.mel)
        wasm("run", *self.programs[1], 0)
        return wasm.get(self.out, (self.t, self.d), np.float32)


def _is_matrix(name):
    """The tensors the GEMMs read as f16 (the attention and MLP matrices)."""
    return name.endswith(".weight") and ("_proj" in name or ".fc" in name)
