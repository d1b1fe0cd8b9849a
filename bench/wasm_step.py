"""A whole SmolLM2-135M-Instruct Q4_1 decode step from kernels.wasm under wasmtime (one `run` call
of the recorded 634-call program: tests/wasm_smollm2_step.py) against the CPU device's decode
step (tallow's own generate loop, replayed from its captured step), same model, same box.

    python bench/wasm_step.py [--tokens 32] [--rounds 3]

Rounds interleave the two; each round times --tokens decode steps of each after a short prompt.
The wasm side is one thread and runs the prompt one token at a time (not timed); the CPU device
uses $TALLOW_THREADS threads (set TALLOW_THREADS=1 for the one-thread ratio). Last line:
`wasm_step_vs_cpu decode=X` (tokens/s, wasm / cpu, the best rounds).
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import tallow
    from tallow.backends.wasm import build
    from tallow.backends.wasm.native import Kernels
    from tallow.generation import chat_prompt_ids
    from tallow.generation.decoding import generate_ids
    from wasm_smollm2_step import CAPACITY, MODEL, WasmSmolLM2
    if not os.path.exists(MODEL):
        sys.exit(f"wasm_step: {MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    model = tallow.load_model(MODEL, device="cpu")
    prompt = chat_prompt_ids(model, [{"role": "user", "content": "Tell me a story."}])
    if len(prompt) + args.tokens + 1 > CAPACITY:
        sys.exit(f"wasm_step: --tokens {args.tokens} and a {len(prompt)}-token prompt exceed {CAPACITY} cache slots")
    runner = WasmSmolLM2(model, Kernels(build.build()))
    print(f"load average {os.getloadavg()[0]:.1f}; CPU device threads: {tallow.settings.settings().threads}")
    best = {"wasm": 0.0, "cpu": 0.0}
    for r in range(args.rounds):
        for pos, token in enumerate(prompt):
            logits = runner.step(token, pos)
        token, pos = int(np.argmax(logits)), len(prompt)
        started = time.perf_counter()
        for _ in range(args.tokens):
            token = int(np.argmax(runner.step(token, pos)))
            pos += 1
        wasm = args.tokens / (time.perf_counter() - started)
        stamps = []
        for _ in generate_ids(model, list(prompt), max_tokens=args.tokens + 1, stop_tokens=[]):
            stamps.append(time.perf_counter())
        cpu = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        best = {"wasm": max(best["wasm"], wasm), "cpu": max(best["cpu"], cpu)}
        print(f"round {r + 1}: wasm {wasm:.1f} tok/s, cpu device {cpu:.1f} tok/s "
              f"(load average {os.getloadavg()[0]:.1f})")
    print(f"wasm_step_vs_cpu decode={best['wasm'] / best['cpu']:.2f}")


if __name__ == "__main__":
    main()
