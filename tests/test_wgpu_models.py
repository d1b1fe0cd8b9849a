"""Real models end to end on the wgpu device (lavapipe on CI): Whisper tiny.en
transcribes jfk.wav exactly, and SmolLM2-135M-Instruct (Q4_1 GGUF, weights
dequantised inside the wgpu kernels) decodes greedily the same tokens as the
numpy backend. Skipped, with the reason, where there is no wgpu adapter."""
from pathlib import Path

import pytest

import tallow
from tallow.errors import DeviceError

try:
    from tallow_wgpu.backend import WgpuBackend
    WgpuBackend()
    _REASON = None
except DeviceError as e:
    _REASON = str(e)

pytestmark = [pytest.mark.skipif(_REASON is not None, reason=f"no wgpu adapter: {_REASON}"), pytest.mark.slow]

JFK = Path(__file__).parent / "data" / "jfk.wav"
SENTENCE = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
# Greedy tokens per prompt: 3 short chat prompts x 16 new tokens keeps this test
# near a minute on a 2-core CI machine (lavapipe is a CPU emulation).
SMOL_PROMPTS = ["What is the capital of France?",
                "Write a haiku about the sea.",
                "Explain in one sentence why the sky is blue."]
SMOL_TOKENS = 16


def test_whisper_tiny_en_transcribes_jfk_on_wgpu():
    from tallow.models import whisper
    model = whisper.load(tallow.hub.fetch("whisper-tiny.en", progress=False), device="wgpu")
    result = model.transcribe(str(JFK), temperature=0.0, timestamps=False)
    assert result.text.strip() == SENTENCE


def test_smollm2_greedy_on_wgpu_matches_numpy():
    from tallow.generation import chat_prompt_ids, generate_ids
    path = tallow.hub.fetch("smollm2-135m-instruct", progress=False)
    gpu = tallow.load_model(path, device="wgpu")
    cpu = tallow.load_model(path, device="cpu")
    for prompt in SMOL_PROMPTS:
        ids = chat_prompt_ids(cpu, [{"role": "user", "content": prompt}])
        want = list(generate_ids(cpu, ids, max_tokens=SMOL_TOKENS, stop_tokens=[]))
        got = list(generate_ids(gpu, ids, max_tokens=SMOL_TOKENS, stop_tokens=[]))
        assert got == want, f"{prompt!r}: wgpu {gpu.tokenizer.decode(got)!r} vs numpy {cpu.tokenizer.decode(want)!r}"
