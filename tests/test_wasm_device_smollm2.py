"""The wasm device runs a real model through tallow's own path: SmolLM2-135M-Instruct Q4_1 loaded with
load_model(..., device="wasm") and decoded greedily by the normal generate path gives the CPU
device's ids (its prompt read 8 tokens at a time: its int16-activation kernels, as kernels.wasm's), with the decode step captured and replayed as one `run` call of kernels.wasm per
token (issue 31 item 3), natively under wasmtime.
"""
import os

import pytest

import tallow

pytest.importorskip("wasmtime", reason="the wasm device runs natively under wasmtime: pip install wasmtime")
from tallow.backends.wasm import build  # noqa: E402
from wasm_smollm2_step import MODEL, cpu_greedy  # noqa: E402

pytestmark = pytest.mark.models

if not os.path.exists(build.SHIPPED):
    pytest.skip("kernels.wasm is not built here: make wasm", allow_module_level=True)


@pytest.fixture(scope="module")
def models():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    return tallow.load_model(MODEL, device="cpu"), tallow.load_model(MODEL, device="wasm")


def test_greedy_ids_on_the_wasm_device_equal_the_cpu_device_and_steps_replay_as_one_run(models):
    from tallow.generation import chat_prompt_ids
    from tallow.generation.decoding import generate_ids
    cpu, wasm = models
    assert wasm.device.type == "wasm"
    backend = wasm.device.backend
    driver = backend.driver
    calls, replays = [], []  # every export called; what each replay called
    original_call, original_replay = driver._call, backend.replay

    def counting(export, args):
        calls.append((export, args[1] if export == "run" else None))
        return original_call(export, args)

    def replay(recording, position, tokens):
        before = len(calls)
        original_replay(recording, position, tokens)
        replays.append((calls[before:], recording.handle.count))
    driver._call, backend.replay = counting, replay
    try:
        for question, tokens in (("What is the capital of France?", 12), ("Name three colours.", 10)):
            prompt = chat_prompt_ids(cpu, [{"role": "user", "content": question}])
            want = cpu_greedy(cpu, list(prompt), tokens)
            replays[:] = []
            got = list(generate_ids(wasm, list(prompt), max_tokens=tokens))
            assert got == want, (question, got, want)
            # the first two steps are captured (and compared), the rest replay
            assert len(replays) >= len(want) - 3 > 0, (len(replays), len(want))
            for made, count in replays:
                # one `run` of the whole recorded step: 30 layers of calls, embedding to logits
                assert made == [("run", count)] and count >= 30 * 8, (made, count)
    finally:
        del driver._call, backend.replay

