"""The page without a GPU (issue 31's bench): tallow's WebAssembly compute against llama.cpp built
for wasm (npm `@wllama/wllama`) and whisper.cpp built for wasm (npm `@transcribe/shout`), all in
one headless Chromium on this box, in the same run.

* SmolLM2-135M-Instruct Q4_1 (the same GGUF for both): a 64-token prompt, then 32 greedy decode
  tokens. tallow runs in the demo page opened with `?device=wasm` in a Chromium without WebGPU
  (the page's wasm device: BrowserWasmDriver, the model loaded by the page, tallow's own
  generation loop in the worker, one replayed `run` call a token); the ratios use this. The
  second tallow line is kernels.wasm's recorded programs driven from JS with no Python (the
  prompt as one `run` call, each token one call, as bench/wasm_step_chromium.py does); wllama
  runs llama.cpp's server loop in its worker (`n_gpu_layers: 0`, temperature 0,
  `ignore_eos`), its own timings. 1 thread each, then N threads each where the page is
  cross-origin isolated (this bench serves COOP/COEP headers, as `tallow web serve` does for the
  demo page; the page's wasm device then runs `?threads=N`, docs/wasm.md "Threads"); the
  JS-driven kernels programs stay one thread.
* jfk.wav with Whisper tiny.en: whisper.cpp on a ggml file converted by bench/ggml_whisper.py from
  the very safetensors tallow loads, against the tallow demo page opened with `?device=wasm` in a
  Chromium without WebGPU (the page says which device it really used). A page that has not
  finished within --whisper-limit-s counts as that limit, so the ratio is then an upper bound.

    python bench/web_cpu.py [--threads 2] [--whisper-limit-s 600] [--skip-whisper]

Needs /usr/bin/chromium, playwright, npm (the peers are installed from bench/web_peers/
package-lock.json into bench/web_peers/node_modules), the models in the tallow cache.
Last line: `wasm_vs_wllama decode=X prefill=Y whisper_vs_whispercpp=Z threads=N`, each the peer's
time over tallow's (above 1.00 tallow is faster), both at N threads (the line above it: both at 1).
"""
import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
PEERS = os.path.join(HERE, "web_peers")
JFK = os.path.join(ROOT, "tests", "data", "jfk.wav")
PROMPT_TOKENS, DECODE_TOKENS = 64, 32
PROMPT_TEXT = ("The history of the lighthouse begins in the ancient world, where fires were lit on hills "
               "to guide ships home. Over the centuries keepers tended lamps of oil, then kerosene, then "
               "electric light, and the towers grew taller and stronger against the storms of the sea.")

WLLAMA_PAGE = """<!doctype html><meta charset="utf-8"><title>wllama</title><script type="module">
import { Wllama } from "./peers/wllama/index.js";
const cfg = await (await fetch("wllama.json")).json();
const blob = await (await fetch(cfg.model)).blob();
const out = {};
for (const threads of cfg.threads) {
  const w = new Wllama({ default: "./peers/wllama/wllama.wasm" }, { suppressNativeLog: true });
  await w.loadModel([blob], { n_threads: threads, n_ctx: 256, n_gpu_layers: 0 });
  const r = await w.createCompletion({ prompt: cfg.prompt, max_tokens: cfg.tokens, temperature: 0,
                                       ignore_eos: true, cache_prompt: false });
  out[threads] = { timings: r.timings, text: r.choices[0].text, multi: w.isMultithread ? w.isMultithread() : null };
  await w.exit();
}
window.result = { runs: out, isolated: crossOriginIsolated };
</script><script>addEventListener("error", (e) => (document.body.dataset.failed = String(e.message)));
addEventListener("unhandledrejection", (e) => (document.body.dataset.failed = String(e.reason)));</script>"""

SHOUT_PAGE = """<!doctype html><meta charset="utf-8"><title>shout</title><script type="module">
import createModule from "./peers/shout/shout.wasm.js";
const cfg = await (await fetch("shout.json")).json();
const pcm = new Float32Array(await (await fetch("jfk.f32")).arrayBuffer());
const out = {};
for (const threads of cfg.threads) {
  const texts = [];
  const Module = await createModule({ print: (t) => texts.push(t), printErr: () => {} });
  const model = new Uint8Array(await (await fetch(cfg.model)).arrayBuffer());
  Module.FS_createDataFile("/", "model.bin", model, true, true);
  Module.init("model.bin", "");
  const done = new Promise((resolve) => { Module.onTranscribed = resolve; });
  Module.onProgress = () => {}; Module.onNewSegment = () => {}; Module.onCanceled = () => {};
  const t0 = performance.now();
  Module.transcribe(pcm, "en", threads, false, 0, false, false, false);
  const result = await done;
  out[threads] = { seconds: (performance.now() - t0) / 1000, result };
  Module.free();
}
window.result = { runs: out, isolated: crossOriginIsolated };
</script><script>addEventListener("error", (e) => (document.body.dataset.failed = String(e.message)));
addEventListener("unhandledrejection", (e) => (document.body.dataset.failed = String(e.reason)));</script>"""


class _IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with the headers that make a page cross-origin isolated (SharedArrayBuffer,
    so the peers' pthread builds may start workers)."""
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript", ".mjs": "text/javascript"}

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args):
        pass


def ensure_peers():
    """npm ci of bench/web_peers (cached by npm); the path of its node_modules."""
    modules = os.path.join(PEERS, "node_modules")
    if not os.path.exists(os.path.join(modules, "@wllama", "wllama", "esm", "wasm", "wllama.wasm")) or \
            not os.path.exists(os.path.join(modules, "@transcribe", "shout", "src", "shout", "shout.wasm.js")):
        if shutil.which("npm") is None:
            raise FileNotFoundError("npm is not installed: the peers come from the npm registry (apt-get install npm)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=PEERS, check=True,
                       stdout=subprocess.DEVNULL)
    return modules


def jfk_samples():
    with wave.open(JFK, "rb") as w:
        if w.getframerate() != 16000 or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{JFK} is not 16 kHz mono 16-bit")
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0


def _link(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)


def open_page(browser, url, timeout_s):
    errors, console = [], []
    page = browser.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: console.append(m.text))
    page.goto(url)
    page.wait_for_function("window.result || document.body.dataset.failed", timeout=timeout_s * 1000)
    failed = page.evaluate("document.body.dataset.failed")
    result = page.evaluate("window.result")
    page.close()
    if failed or errors or not result:
        raise RuntimeError(f"{url} failed: {failed or errors}; console: {console[-20:]}")
    return result


def tallow_in_page(ids, limit_s, whisper=True, threads=(1,)):
    """The demo page itself, `?device=wasm&threads=T`, in a Chromium without WebGPU, served cross-origin
    isolated (tallow web serve's COOP/COEP), for each T: SmolLM2 on the prompt ids (stream() in the
    page's worker on the page's loaded model: prefill and decode tok/s, the ids, the device the model
    is on, the threads the wasm device ran), then jfk.wav with whisper-tiny.en through the page's
    transcribe request ((seconds or None past limit_s, text)). Returns {T: (device the page chose,
    smollm2, whisper)}."""
    from browser import harness
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        dist = os.path.join(tmp, "dist")
        harness.build_test_site(dist)
        with harness.DemoBrowser(dist) as demo, \
                demo.other_browser(["--disable-webgpu"], without=["--enable-unsafe-webgpu"]) as context:
            for t in threads:
                page = context.new_page()
                demo.watch(page)
                demo.goto(page, f"?device=wasm&threads={t}", timeout_s=300)
                device = page.evaluate("window.tallowDemo.ready").get("device")
                demo.request(page, "load", model="smollm2-135m-instruct", timeout_s=600)
                smollm2 = demo.run(page, f"""import tallow_web_worker as w
from tallow.generation import stream
m = w.state['models']['smollm2-135m-instruct']
s = stream(m, {list(ids)!r}, max_tokens={DECODE_TOKENS}, stop_tokens=[])
s.text()
dict(ids=list(s.token_ids), prefill_tok_s=s.prefill_tokens_per_second, tok_s=s.decode_tokens_per_second,
     device=str(m.device), replays=m.device.backend.replays if m.device.type == 'wasm' else 0,
     threads=getattr(m.device.backend.driver, 'threads', 1) if m.device.type == 'wasm' else 1,
     memory=m.device.backend.driver.memory_bytes() if m.device.type == 'wasm' else 0)""", timeout_s=900)
                speech = None
                if whisper:
                    demo.request(page, "load", model="whisper-tiny.en", timeout_s=600)
                    with open(JFK, "rb") as f:
                        wav = list(f.read())
                    started = time.perf_counter()
                    r = page.evaluate("""async ([bytes, ms]) => await Promise.race([
                        window.tallowDemo.request('transcribe', {model: 'whisper-tiny.en', audio: new Uint8Array(bytes),
                                                                  samples: false}),
                        new Promise((resolve) => setTimeout(() => resolve(null), ms))])""", [wav, limit_s * 1000])
                    seconds = time.perf_counter() - started
                    speech = (None, "") if r is None else (r.get("seconds", seconds), r.get("text", ""))
                page.close()
                out[t] = (device, smollm2, speech)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="the peers' multi-thread runs (default 2)")
    ap.add_argument("--whisper-limit-s", type=float, default=600.0,
                    help="how long tallow's page may take on jfk.wav before it counts as that long")
    ap.add_argument("--skip-whisper", action="store_true", help="SmolLM2 only (whisper ratio printed as nan)")
    args = ap.parse_args()
    import tallow
    from browser.harness import CHROMIUM, CHROMIUM_ARGS, missing_requirements
    from wasm_smollm2_step import MODEL
    from wasm_step_chromium import write_site
    import ggml_whisper
    missing = missing_requirements()
    if missing:
        sys.exit(f"web_cpu: cannot run the browser: {missing}")
    if not os.path.exists(MODEL):
        sys.exit(f"web_cpu: {MODEL} is not in the tallow cache: tallow fetch smollm2-135m-instruct")
    modules = ensure_peers()
    home = os.environ.get("TALLOW_HOME", os.path.expanduser("~/.cache/tallow"))
    whisper_dir = os.path.join(home, "whisper-tiny.en")
    ggml = os.path.join(home, "ggml", "ggml-tiny.en.bin")
    if not args.skip_whisper:
        if not os.path.exists(os.path.join(whisper_dir, "model.safetensors")):
            sys.exit(f"web_cpu: {whisper_dir} is missing: tallow fetch whisper-tiny.en")
        if not os.path.exists(ggml):
            os.makedirs(os.path.dirname(ggml), exist_ok=True)
            ggml_whisper.convert(whisper_dir, ggml)

    model = tallow.load_model(MODEL, device="cpu")
    ids = model.tokenizer.encode(PROMPT_TEXT * 2)[:PROMPT_TOKENS]
    if len(ids) != PROMPT_TOKENS:
        raise RuntimeError(f"the prompt text gives {len(ids)} tokens, not {PROMPT_TOKENS}")
    threads = [1] + ([args.threads] if args.threads > 1 else [])
    folder = tempfile.mkdtemp(prefix="tallow-web-cpu-")
    try:
        native = write_site(folder, model, ids, DECODE_TOKENS, page="tallow.html")
        _link(os.path.join(modules, "@wllama", "wllama", "esm", "index.js"),
              os.path.join(folder, "peers", "wllama", "index.js"))
        _link(os.path.join(modules, "@wllama", "wllama", "esm", "wasm", "wllama.wasm"),
              os.path.join(folder, "peers", "wllama", "wllama.wasm"))
        _link(os.path.join(modules, "@transcribe", "shout", "src", "shout", "shout.wasm.js"),
              os.path.join(folder, "peers", "shout", "shout.wasm.js"))
        _link(MODEL, os.path.join(folder, "model.gguf"))
        for name, text in (("wllama.html", WLLAMA_PAGE), ("shout.html", SHOUT_PAGE)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        with open(os.path.join(folder, "wllama.json"), "w") as f:
            json.dump({"model": "model.gguf", "prompt": model.tokenizer.decode(ids), "tokens": DECODE_TOKENS,
                       "threads": threads}, f)
        if not args.skip_whisper:
            _link(ggml, os.path.join(folder, "ggml-tiny.en.bin"))
            jfk_samples().tofile(os.path.join(folder, "jfk.f32"))
            with open(os.path.join(folder, "shout.json"), "w") as f:
                json.dump({"model": "ggml-tiny.en.bin", "threads": threads}, f)
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_IsolatedHandler, directory=folder))
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        from playwright.sync_api import sync_playwright
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(headless=True, executable_path=CHROMIUM,
                                            args=CHROMIUM_ARGS + ["--disable-webgpu"])
                try:
                    ours = open_page(browser, url + "tallow.html", 900)
                    peer = open_page(browser, url + "wllama.html", 900)
                    shout = None if args.skip_whisper else open_page(browser, url + "shout.html", 900)
                finally:
                    browser.close()
        finally:
            server.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; cross-origin isolated: {peer['isolated']}")
    print(f"SmolLM2-135M-Instruct Q4_1, {PROMPT_TOKENS}-token prompt, {DECODE_TOKENS} greedy tokens:")
    pages = tallow_in_page(ids, args.whisper_limit_s, whisper=not args.skip_whisper, threads=threads)
    for t in threads:
        device, page_llm, _ = pages[t]
        print(f"  tallow page ?device=wasm&threads={t} (ran on {device}, {page_llm['threads']} thread(s); the model on "
              f"{page_llm['device']}): prefill {page_llm['prefill_tok_s']:.1f} tok/s, decode {page_llm['tok_s']:.1f} "
              f"tok/s ({page_llm['replays']} replays; ids equal native tallow's: "
              f"{page_llm['ids'] == native['native_ids'][:len(page_llm['ids'])]})")
        if page_llm["memory"]:  # the page's own figure (docs/wasm.md "Memory"; issue 31: at most 1.2x the file)
            memory, file_bytes = page_llm["memory"], os.path.getsize(MODEL)
            print(f"  tallow page ?device=wasm&threads={t}: wasm memory {memory / 1e6:.1f} MB for the "
                  f"{file_bytes / 1e6:.1f} MB model file ({memory / file_bytes:.2f}x)")
    print(f"  tallow kernels.wasm programs driven from JS, 1 thread: prefill {ours['prefill_tok_s']:.1f} tok/s, decode "
          f"{ours['tok_s']:.1f} tok/s (wasmtime in this process: {native['wasmtime_prefill_tok_s']:.1f} / "
          f"{native['wasmtime_tok_s']:.1f}; ids equal wasmtime's: {ours['ids'] == native['native_ids']})")
    runs = peer["runs"]
    for t in threads:
        tm = runs[str(t)]["timings"]
        print(f"  wllama {t} thread(s): prefill {tm['prompt_per_second']:.1f} tok/s ({tm['prompt_n']} tokens), "
              f"decode {tm['predicted_per_second']:.1f} tok/s ({tm['predicted_n']} tokens)")
    print(f"  texts: tallow {model.tokenizer.decode(ours['ids'][:DECODE_TOKENS])!r}")
    print(f"         wllama {runs['1']['text']!r}")
    if shout is not None:
        for t in threads:
            run = shout["runs"][str(t)]
            text = "".join(seg.get("text", "") for seg in (run["result"] or {}).get("transcription", []))
            print(f"  whisper.cpp (shout) {t} thread(s): jfk {run['seconds']:.2f} s: {text.strip()!r}")
        for t in threads:
            device, _, (seconds, text) = pages[t]
            if seconds is None:
                print(f"  tallow page ?device=wasm&threads={t} (ran on {device}): jfk not finished in "
                      f"{args.whisper_limit_s:.0f} s; the ratio is an upper bound")
            else:
                print(f"  tallow page ?device=wasm&threads={t} (ran on {device}): jfk {seconds:.2f} s: {text!r}")
    ratios = {}
    for t in threads:  # each at the same thread count: tallow's T threads against the peers' T threads
        page_llm, speech, peer_t = pages[t][1], pages[t][2], runs[str(t)]["timings"]
        whisper = float("nan")
        if shout is not None:
            seconds = speech[0] if speech[0] is not None else args.whisper_limit_s
            whisper = shout["runs"][str(t)]["seconds"] / seconds
        ratios[t] = (page_llm["tok_s"] / peer_t["predicted_per_second"],
                     page_llm["prefill_tok_s"] / peer_t["prompt_per_second"], whisper)
        if t != threads[-1]:
            print(f"  at {t} thread(s): wasm_vs_wllama decode={ratios[t][0]:.2f} prefill={ratios[t][1]:.2f} "
                  f"whisper_vs_whispercpp={ratios[t][2]:.2f}")
    decode, prefill, whisper = ratios[threads[-1]]
    print(f"wasm_vs_wllama decode={decode:.2f} prefill={prefill:.2f} whisper_vs_whispercpp={whisper:.2f} "
          f"threads={threads[-1]}")

if __name__ == "__main__":
    main()
