"""The browser demo's figures: first-load bytes and time to interactive, Pyodide boot,
model load, jfk.wav transcription and chat tokens/s in headless Chromium (WebGPU = SwiftShader here, and the pure-Python
CPU fallback), next to tallow natively (numpy, and wgpu when it works) in the same run.

    python bench/web.py                        # chat on WebGPU + native numpy/wgpu
    python bench/web.py --whisper              # also transcribe jfk.wav (minutes on SwiftShader)
    python bench/web.py --cpu-fallback         # also the pure-Python page (very slow for real models)
    python bench/web.py --first-load-only      # first-load bytes and time to interactive only

Prints figures only; nothing here is a threshold. Needs what tests/test_browser.py needs.
"""
import argparse
import importlib.util
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Run as `python bench/web.py`, bench/ is sys.path[0] and bench/wgpu.py would shadow the wgpu package.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
REPO_ROOT = os.path.dirname(HERE)
JFK = os.path.join(REPO_ROOT, "tests", "data", "jfk.wav")
PROMPT = "Name three colours of the rainbow."


def _harness():
    path = os.path.join(REPO_ROOT, "tests", "browser", "harness.py")
    spec = importlib.util.spec_from_file_location("tallow_bench_browser_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _served_bytes(dist, paths):
    """Bytes of the files behind request paths (query strings dropped)."""
    total = 0
    for path in paths:
        local = os.path.join(dist, path.split("?")[0].lstrip("/") or "index.html")
        if os.path.isdir(local):
            local = os.path.join(local, "index.html")
        total += os.path.getsize(local) if os.path.isfile(local) else 0
    return total


def browser_figures(demo, query, tokens, whisper, models=True):
    out = {}
    before = len(demo.server.requests)
    started = time.perf_counter()
    page = demo.open(query, timeout_s=180)
    # interactive: the page's controls are enabled (body[data-ready]); a fresh profile, so nothing cached
    out["time to interactive s (boot + install + device probe)"] = time.perf_counter() - started
    if before == 0:  # the first page of a fresh profile; later pages revalidate from the HTTP cache
        first_load = demo.server.requests[before:]
        out["first-load MB (what the page fetched until interactive)"] = _served_bytes(demo.dist, first_load) / 1e6
        out["  requests"] = len(first_load)
    info = page.evaluate("window.tallowDemo.ready")
    out["  of which Pyodide boot"] = info["boot_s"]
    label = "WebGPU " + info["gpu"]["adapter"] if info["device"] == "wgpu" else f"CPU fallback ({info['device']})"
    if not models:
        page.close()
        return label, out
    loaded = demo.request(page, "load", model="smollm2-135m-instruct", timeout_s=600)
    out["SmolLM2 load (fetch + parse + upload)"] = loaded["seconds"]
    r = demo.request(page, "chat", timeout_s=3600, model="smollm2-135m-instruct",
                     messages=[{"role": "user", "content": PROMPT}], maxTokens=tokens)
    out["SmolLM2 prefill tokens/s"] = r["prefill_tokens_per_s"]
    out["SmolLM2 decode tokens/s"] = r["tokens_per_s"]
    if whisper:
        loaded = demo.request(page, "load", model="whisper-tiny.en", timeout_s=600)
        out["whisper tiny.en load"] = loaded["seconds"]
        with open(JFK, "rb") as f:
            wav = list(f.read())
        r = page.evaluate("""async (bytes) => await window.tallowDemo.request('transcribe',
            {model: 'whisper-tiny.en', audio: new Uint8Array(bytes), samples: false})""", wav)
        out["jfk.wav transcription s"] = r["seconds"]
        out["  real-time factor"] = r["rtf"]
    page.close()
    return label, out


def native_figures(device, tokens, whisper):
    import tallow
    from tallow.generation import chat
    out = {}
    started = time.perf_counter()
    model = tallow.load_model("smollm2-135m-instruct", device=device)
    out["SmolLM2 load"] = time.perf_counter() - started
    s = chat(model, [{"role": "user", "content": PROMPT}], stream=True, max_tokens=tokens)
    s.text()
    out["SmolLM2 prefill tokens/s"] = s.prefill_tokens_per_second
    out["SmolLM2 decode tokens/s"] = s.decode_tokens_per_second
    if whisper:
        from tallow.models.whisper_transcribe import transcribe
        w = tallow.load_model("whisper-tiny.en", device=device)
        started = time.perf_counter()
        r = transcribe(w, JFK)
        out["jfk.wav transcription s"] = time.perf_counter() - started
        out["  real-time factor"] = out["jfk.wav transcription s"] / 11.0
        out["  text"] = r.text.strip()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--whisper", action="store_true")
    parser.add_argument("--cpu-fallback", action="store_true")
    parser.add_argument("--no-native", action="store_true")
    parser.add_argument("--first-load-only", action="store_true", help="only first-load bytes and time to interactive")
    parser.add_argument("--device", default=None, help="the page's ?device= (default: the page's own choice, which "
                        "passes a software adapter such as SwiftShader over for wasm; wgpu measures SwiftShader)")
    args = parser.parse_args(argv)
    harness = _harness()
    missing = harness.missing_requirements()
    if missing:
        sys.exit(f"cannot benchmark the browser: {missing}")
    build = harness.load_web_module("build")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        dist = os.path.join(tmp, "dist")
        build.build(dist, quiet=True)
        with harness.DemoBrowser(dist) as demo:
            for query in [f"?device={args.device}" if args.device else ""] + (["?cpu"] if args.cpu_fallback else []):
                label, figures = browser_figures(demo, query, args.tokens, args.whisper, not args.first_load_only)
                results[f"Chromium, {label}"] = figures
    if not args.no_native and not args.first_load_only:
        for device in ("cpu", "wgpu"):
            try:
                results[f"native tallow, {device}"] = native_figures(device, args.tokens, args.whisper)
            except Exception as e:  # report, keep going: the other columns are still figures
                results[f"native tallow, {device}"] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
    for where, figures in results.items():
        print(f"\n{where}")
        for k, v in figures.items():
            print(f"  {k:45s} {v:10.3f}" if isinstance(v, float) else f"  {k:45s} {v}")


if __name__ == "__main__":
    main()
