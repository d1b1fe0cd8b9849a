"""The SmolLM2-135M-Instruct Q4_1 decode step of bench/wasm_step.py (kernels.wasm's `run`, one call
per token), after the prompt read as one program (one call), in headless Chromium. The memory
image wasmtime holds (weights, both programs, the f16 table, empty caches) is copied into a
WebAssembly.Memory in a page, and JS runs the prompt and the steps, writing the two step words
and taking the argmax itself. Checks the page's greedy ids against wasmtime's and prints both
speeds, so V8's SIMD128 code is measured on exactly the work wasmtime did (one thread each, same
box, same run).

    python bench/wasm_step_chromium.py [--tokens 32]

Needs /usr/bin/chromium and playwright (as tests/test_browser.py); the model in the tallow cache.
Last line: `wasm_step chromium=X wasmtime=Y tok/s ids_equal=True|False` (decode).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

PAGE = """<!doctype html><meta charset="utf-8"><title>wasm step</title><script type="module">
const cfg = await (await fetch("step.json")).json();
const module = await WebAssembly.compileStreaming(fetch("kernels.wasm"));
const image = new Uint8Array(await (await fetch("image.bin")).arrayBuffer());
const memory = new WebAssembly.Memory({ initial: Math.ceil(image.length / 65536) });
new Uint8Array(memory.buffer).set(image);
const { run } = (await WebAssembly.instantiate(module, { env: { memory } })).exports;
const step = (token, pos) => {
  new Int32Array(memory.buffer, cfg.step, 2).set([pos, token]);
  run(cfg.program, cfg.count, cfg.step);
  return argmax();
};
const argmax = () => {
  const logits = new Float32Array(memory.buffer, cfg.logits, cfg.vocab);
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
};
const p0 = performance.now();
run(cfg.prefill, cfg.prefill_count, cfg.step);  // the whole prompt: one call
const prefillSeconds = (performance.now() - p0) / 1000;
const ids = [argmax()];
const t0 = performance.now();
for (let pos = cfg.prompt.length; ids.length < cfg.tokens + 1; pos++) ids.push(step(ids[ids.length - 1], pos));
const seconds = (performance.now() - t0) / 1000;
window.result = { ids, tok_s: cfg.tokens / seconds, prefill_tok_s: cfg.prompt.length / prefillSeconds };
</script><script>addEventListener("error", () => (document.body.dataset.failed = "1"));</script>"""


def write_site(folder, model, prompt, tokens, page="index.html"):
    """Writes the page (as `page`), kernels.wasm, image.bin and step.json into folder for `tokens`
    greedy steps after `prompt` (ids); runs the same image under wasmtime in this process first and
    returns {native_ids, wasmtime_tok_s, wasmtime_prefill_tok_s, image_bytes, calls}."""
    from tallow.backends.wasm import build
    from tallow.backends.wasm.native import PAGE as WASM_PAGE, Kernels
    from tallow.backends.wasm.program import encode
    from wasm_smollm2_step import CAPACITY, WasmSmolLM2
    if len(prompt) + tokens + 1 > CAPACITY:
        raise ValueError(f"{tokens} tokens and a {len(prompt)}-token prompt exceed {CAPACITY} cache slots")
    wasm = Kernels(build.build())
    runner = WasmSmolLM2(model, wasm)
    words, prefill_count = encode(runner.prefill_calls(list(prompt)))
    prefill = wasm.put(np.frombuffer(words.tobytes(), np.int32))
    size = wasm.memory.size(wasm.store) * WASM_PAGE
    image = wasm.memory.read(wasm.store, 0, size)  # before any step: weights, program, f16 table, empty caches
    with open(os.path.join(folder, "image.bin"), "wb") as f:
        f.write(image)
    shutil.copy(build.build(), os.path.join(folder, "kernels.wasm"))
    with open(os.path.join(folder, "step.json"), "w") as f:
        json.dump({"program": runner.program, "count": runner.count, "step": runner.step_at,
                   "prefill": prefill, "prefill_count": prefill_count,
                   "logits": runner.logits, "vocab": model.config.vocab_size, "prompt": list(prompt),
                   "tokens": tokens}, f)
    with open(os.path.join(folder, page), "w") as f:
        f.write(PAGE)
    # wasmtime on the same image (this process's memory still holds it): ids and speed
    started = time.perf_counter()
    wasm("run", prefill, prefill_count, runner.step_at)
    native_prefill = len(prompt) / (time.perf_counter() - started)
    ids = [int(np.argmax(wasm.get(runner.logits, (model.config.vocab_size,), np.float32)))]
    started = time.perf_counter()
    for pos in range(len(prompt), len(prompt) + tokens):
        ids.append(int(np.argmax(runner.step(ids[-1], pos))))
    native = tokens / (time.perf_counter() - started)
    return {"native_ids": ids, "wasmtime_tok_s": native, "wasmtime_prefill_tok_s": native_prefill,
            "image_bytes": size, "calls": runner.count}


def measure(tokens):
    """{native_ids, chromium_ids, chromium_tok_s, wasmtime_tok_s, image_bytes, calls}: `tokens`
    greedy tokens after a short chat prompt, from one memory image under wasmtime and in Chromium."""
    import tallow
    from tallow.generation import chat_prompt_ids
    from wasm_smollm2_step import MODEL
    from browser.harness import CHROMIUM, CHROMIUM_ARGS, PlainStaticServer
    if not os.path.exists(MODEL):
        raise FileNotFoundError(f"{MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    model = tallow.load_model(MODEL, device="cpu")
    prompt = chat_prompt_ids(model, [{"role": "user", "content": "Tell me a story."}])
    folder = tempfile.mkdtemp(prefix="tallow-wasm-step-")
    errors = []
    try:
        native = write_site(folder, model, prompt, tokens)
        with open(os.path.join(folder, "site.json"), "w") as f:
            f.write("{}")  # what PlainStaticServer polls for
        from playwright.sync_api import sync_playwright
        with PlainStaticServer(folder) as server, sync_playwright() as p:
            browser = p.chromium.launch(headless=True, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(server.url + "index.html")
                page.wait_for_function("window.result || document.body.dataset.failed", timeout=600_000)
                result = page.evaluate("window.result")
            finally:
                browser.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if errors or not result:
        raise RuntimeError(f"the page failed: {errors}")
    return {**native, "chromium_ids": result["ids"], "chromium_tok_s": result["tok_s"],
            "prompt_tokens": len(prompt), "chromium_prefill_tok_s": result["prefill_tok_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    try:
        r = measure(args.tokens)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"wasm_step_chromium: {e}")
    print(f"load average {os.getloadavg()[0]:.1f}; image {r['image_bytes'] / 2**20:.0f} MiB; "
          f"{r['calls']} kernel calls a step")
    print(f"wasmtime ids {r['native_ids']}")
    print(f"chromium ids {r['chromium_ids']}")
    equal = r["chromium_ids"] == r["native_ids"]
    print(f"prefill of {r['prompt_tokens']} tokens as one program: chromium {r['chromium_prefill_tok_s']:.1f} "
          f"wasmtime {r['wasmtime_prefill_tok_s']:.1f} tok/s")
    print(f"wasm_step chromium={r['chromium_tok_s']:.1f} wasmtime={r['wasmtime_tok_s']:.1f} tok/s ids_equal={equal}")


if __name__ == "__main__":
    main()
