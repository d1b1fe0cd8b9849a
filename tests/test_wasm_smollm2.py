"""kernels.wasm has everything a SmolLM2 decode step needs: SmolLM2-135M-Instruct Q4_1 decoded
greedily, every token one `run` call of one recorded program (embedding row to logits, all 30
layers; the position and the token read from two step words), natively under wasmtime, gives
the CPU device's greedy ids.

This is the kernel set's proof for issue 31, not the wasm device: the device (docs/wasm.md,
"The device design") records the same calls from the model's own ops. Here the program is
written out from the model's weights, which the CPU device loads. The prompt is read one token
at a time, as decode steps.
"""
import os

import numpy as np
import pytest

import tallow

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402
from wasm_smollm2_step import CAPACITY, MODEL, WasmSmolLM2, cpu_greedy  # noqa: E402

pytestmark = pytest.mark.models

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)


@pytest.fixture(scope="module")
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    return tallow.load_model(MODEL, device="cpu")


def test_smollm2_greedy_ids_from_kernels_wasm_equal_the_cpu_device(model):
    from tallow.generation import chat_prompt_ids
    assert not model.config.rope_scaling  # plain rotary tables below
    prompt = chat_prompt_ids(model, [{"role": "user", "content": "What is the capital of France?"}])
    want = cpu_greedy(model, list(prompt), 12)  # the prompt 8 rows at a time: int16 activations, as here
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


def test_a_prompt_read_as_one_program_gives_the_same_ids(model):
    """The prompt as one `run` call (each product over all its rows at once, the 4-row tiles of
    matmul_<fmt>), then the recorded step: the CPU device's greedy ids."""
    from tallow.generation import chat_prompt_ids
    prompt = chat_prompt_ids(model, [{"role": "user", "content": "Name three colours."}])
    want = cpu_greedy(model, list(prompt), 8)
    runner = WasmSmolLM2(model, Kernels(build.build()))
    got = [int(np.argmax(runner.prefill(prompt)))]
    for pos in range(len(prompt), len(prompt) + len(want) - 1):
        got.append(int(np.argmax(runner.step(got[-1], pos))))
    assert got == want, (got, want)


def test_a_step_is_one_run_call(model, monkeypatch):
    """Python calls the module once per token: the program was recorded once; a step writes the
    two step words and calls `run`."""
    runner = WasmSmolLM2(model, Kernels(build.build()))
    calls = []
    original = Kernels.__call__
    monkeypatch.setattr(Kernels, "__call__", lambda self, name, *args: calls.append(name) or original(self, name, *args))
    runner.step(1, 0)
    runner.step(2, 1)
    assert calls == ["run", "run"]
    assert runner.count == len(runner.step_calls()) == 1 + 30 * 21 + 3  # what each call ran
