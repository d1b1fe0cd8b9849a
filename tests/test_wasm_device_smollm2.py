"""The wasm device runs a real model through tallow's own path: SmolLM2-135M-Instruct Q4_1 loaded with
load_model(..., device="wasm") and decoded greedily by the normal generate path gives the CPU
device's ids, with the decode step captured and replayed as one `run` call of kernels.wasm per
token (issue 31 item 3), natively under wasmtime.
"""
import os

import pytest

import tallow

pytest.importorskip("wasmtime", reason="the wasm device runs natively under wasmtime: pip install wasmtime")
from tallow.backends.wasm import build  # noqa: E402
from wasm_smollm2_step import MODEL  # noqa: E402

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
    runs = []  # the `run` calls of the decode steps, each with its call count
    original = driver._call

    def counting(export, args):
        if export == "run":
            runs.append(args[1])
        return original(export, args)
    driver._call = counting
    try:
        for question, tokens in (("What is the capital of France?", 12), ("Name three colours.", 10)):
            prompt = chat_prompt_ids(cpu, [{"role": "user", "content": question}])
            want = list(generate_ids(cpu, list(prompt), max_tokens=tokens))
            before, runs[:] = backend.replays, []
            got = list(generate_ids(wasm, list(prompt), max_tokens=tokens))
            assert got == want, (question, got, want)
            replayed = backend.replays - before
            # the first two steps are captured (and compared), the rest replay
            assert replayed >= len(want) - 3 > 0, (replayed, len(want))
            # each replay is one `run` of the whole recorded step: ~30 layers of calls, embedding to logits
            steps = [count for count in runs if count >= 30 * 8]
            assert len(steps) >= replayed and len(set(steps)) == 1, runs
    finally:
        del driver._call

