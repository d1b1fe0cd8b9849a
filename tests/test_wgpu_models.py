"""Real models end to end on every device that is not the numpy reference (wgpu on lavapipe
here; the real cuda and metal devices where present): Whisper tiny.en transcribes jfk.wav
exactly, and SmolLM2-135M-Instruct (Q4_1 GGUF, weights dequantised inside the kernels)
decodes greedily the same tokens as the numpy backend. The slow devices (pure Python, the
CPU emulators) skip with the reason (tests/conftest.py: SLOW_DEVICES)."""
import pytest

import tallow

pytestmark = pytest.mark.slow

SENTENCE = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
# Greedy tokens per prompt: 3 short chat prompts x 16 new tokens keeps this test
# near a minute on a 2-core CI machine (lavapipe is a CPU emulation).
SMOL_PROMPTS = ["What is the capital of France?",
                "Write a haiku about the sea.",
                "Explain in one sentence why the sky is blue."]
SMOL_TOKENS = 16


@pytest.fixture
def gpu_device(model_device):
    if model_device.type == "cpu":
        pytest.skip("the numpy backend is the reference these devices are compared with")
    return model_device


def test_whisper_tiny_en_transcribes_jfk(gpu_device, whisper_tiny_dir, jfk_wav):
    from tallow.models import whisper
    model = whisper.load(whisper_tiny_dir, device=gpu_device)
    result = model.transcribe(str(jfk_wav), temperature=0.0, timestamps=False)
    assert result.text.strip() == SENTENCE


def test_smollm2_greedy_matches_numpy(gpu_device, smollm2_gguf):
    from tallow.generation import chat_prompt_ids, generate_ids
    gpu = tallow.load_model(smollm2_gguf, device=gpu_device)
    cpu = tallow.load_model(smollm2_gguf, device="cpu")
    for prompt in SMOL_PROMPTS:
        ids = chat_prompt_ids(cpu, [{"role": "user", "content": prompt}])
        cpu.reset()  # each prompt from an empty cache (test_llm_models: a reused prefix rounds differently)
        gpu.reset()
        want = list(generate_ids(cpu, ids, max_tokens=SMOL_TOKENS, stop_tokens=[]))
        got = list(generate_ids(gpu, ids, max_tokens=SMOL_TOKENS, stop_tokens=[]))
        assert got == want, f"{prompt!r}: {gpu_device} {gpu.tokenizer.decode(got)!r} vs numpy {cpu.tokenizer.decode(want)!r}"
