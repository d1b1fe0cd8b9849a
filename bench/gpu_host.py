"""Host time per decoded token on the GPU path, with a driver that does nothing.

    python bench/gpu_host.py [--tokens N] [--repeats R] [--no-node] [--no-chromium] [--no-pyodide]

The wgpu backend runs over wgpu_backend/driver_null.py: every driver call
returns at once, so the GPU costs zero and what is timed is tallow's own
Python per token (kernel choice, shape checks, parameter packing). That is the
ceiling on tokens/s no GPU can lift. Measured for SmolLM2-135M-Instruct
(Q4_1) one-token decode and for Whisper tiny.en's decoder (one token per step,
the KV cache growing, cross-attention over 1500 audio frames), with the same
code in three places: natively; inside Pyodide under Node (the wasm CPython,
Node's V8); and inside Pyodide in headless Chromium, in the demo page's worker
where the demo's Python runs (the site built with its test hooks, the models
copied into the worker's file system, the null driver bound over the page's
WebGPU device, so SwiftShader's speed does not enter). --no-pyodide skips both
Pyodide runs. Each figure is the best of R runs (default 5): the box is shared,
and Chromium's first run also pays for V8 tiering the wasm up.

Each is measured eager (every op through tallow's front end) and captured
(tallow.capture: the step recorded once, then replayed; CausalLM does this for
one-token steps on wgpu, and Whisper's decode_step for one token per row).
The last line is `host_ms_per_token native=X browser=Y dispatches=Z` for the
SmolLM2 decode, captured where capture works there; browser= is the Chromium
figure. Without Chromium (or Playwright, or web/node_modules) the bench says
why and browser= is the Node figure, marked `(node)`; n/a when neither ran.
The eager figures are on the line above it.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# The measurement, as source text: the same code runs natively and inside Pyodide.
MEASURE = r'''
import time
import tallow
from tallow.device import use_backend
from tallow_wgpu.backend import WgpuBackend
from tallow_wgpu.driver_null import NullDriver


def host_per_token(step, driver, tokens):
    for _ in range(3):   # warm-up: kernel sources built, buffer pool filled
        step()
    driver.reset_counts()
    t = time.perf_counter()
    for _ in range(tokens):
        step()
    ms = (time.perf_counter() - t) / tokens * 1e3
    return ms, driver.dispatches / tokens


def measure(llm_path, whisper_path, tokens):
    driver = NullDriver()
    dev = use_backend("wgpu", WgpuBackend(driver))
    out = {}
    llm = tallow.load_model(llm_path, device=dev)
    for captured in (False, True):
        llm.capture_decode = captured and tallow.can_capture(dev)
        cache = llm.new_cache()
        llm([1, 2, 3, 4], cache=cache, last_only=True).tolist()
        step = lambda: llm([5], cache=cache, last_only=True).tolist()
        ms, disp = host_per_token(step, driver, tokens)
        out["llm captured" if llm.capture_decode else "llm"] = (ms, disp, llm.config.num_layers)
    w = tallow.load_model(whisper_path, device=dev)
    feats = w.encode(tallow.zeros(1, w.config.num_mel_bins, 3000, device=dev))
    for captured in (False, True):
        w.capture_decode = captured and tallow.can_capture(dev)
        state = w.start(feats)
        w.decode_step([w.tokens.sot_sequence(None, "transcribe")], state)
        step = lambda: w.decode_step([[w.tokens.no_timestamps]], state).tolist()
        ms, disp = host_per_token(step, driver, tokens)
        out["whisper captured" if w.capture_decode else "whisper"] = (ms, disp, w.config.decoder_layers)
    return out
'''


def _model_paths():
    from tallow.hub import model_dir
    llm_dir = model_dir("smollm2-135m-instruct")
    gguf = next(os.path.join(llm_dir, f) for f in sorted(os.listdir(llm_dir)) if f.endswith(".gguf"))
    return gguf, model_dir("whisper-tiny.en")


def best_of(runs):
    """Per figure, the run with the least host time: this box is shared, so the fastest run is the
    one least disturbed; and in Chromium the first run also pays for V8 tiering the wasm up."""
    return {key: min((run[key] for run in runs), key=lambda figure: figure[0]) for key in runs[0]}


def native(tokens, repeats):
    scope = {}
    exec(MEASURE, scope)
    gguf, whisper = _model_paths()
    return best_of([scope["measure"](gguf, whisper, tokens) for _ in range(repeats)])


def node(tokens, repeats):
    """The same measurement inside Pyodide under Node, or a reason it could not run."""
    sys.path.insert(0, os.path.join(REPO, "tests", "pyodide"))
    import node_runner
    missing = node_runner.missing_requirements()
    if missing:
        return missing
    import tempfile
    gguf, whisper = _model_paths()
    home = os.path.commonpath([gguf, whisper])
    with tempfile.TemporaryDirectory() as tmp, node_runner.PyodideRunner() as runner:
        runner.install_wheel(node_runner.build_wheel(tmp)[0])
        runner.mount(home, "/models")
        to_inside = lambda p: "/models/" + os.path.relpath(p, home)
        code = f"measure({to_inside(gguf)!r}, {to_inside(whisper)!r}, {tokens})"
        return best_of([runner.run(MEASURE + "\n" + code, timeout=900) for _ in range(repeats)])


def chromium(tokens, repeats):
    """The same measurement inside Pyodide in headless Chromium, in the demo page's worker (where the
    demo's Python runs), or a reason it could not run. The models come from the built site, copied into
    the worker's file system; the null driver is bound over the page's WebGPU device, so SwiftShader's
    speed does not enter."""
    import tempfile
    harness = _load_module("tallow_bench_browser_harness", os.path.join(REPO, "tests", "browser", "harness.py"))
    missing = harness.missing_requirements()
    if missing:
        return missing
    with tempfile.TemporaryDirectory() as tmp:
        dist = os.path.join(tmp, "dist")
        summary = harness.build_test_site(dist)
        absent = {k: v for k, v in summary["models"].items() if isinstance(v, str)}
        if absent:
            return "; ".join(f"{k}: {v}" for k, v in absent.items())
        gguf, _ = _model_paths()
        with harness.DemoBrowser(dist) as demo:
            page = demo.open("?device=wgpu")  # the null driver goes over the page's WebGPU device
            llm = demo.copy_model_files(page, "smollm2-135m-instruct")
            whisper = demo.copy_model_files(page, "whisper-tiny.en")
            code = f"measure({llm + '/' + os.path.basename(gguf)!r}, {whisper!r}, {tokens})"
            result = best_of([demo.run(page, MEASURE + "\n" + code, timeout_s=900) for _ in range(repeats)])
            errors = demo.errors()
            if errors:
                print(f"chromium: console errors during the measurement: {errors}")
            return result


def _load_module(name, path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    tokens = int(sys.argv[sys.argv.index("--tokens") + 1]) if "--tokens" in sys.argv else 20
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 5
    got = {"native": native(tokens, repeats)}
    for where, measure_in in (("node", node), ("chromium", chromium)):
        flag = next((f for f in ("--no-pyodide", f"--no-{where}") if f in sys.argv), None)
        try:
            got[where] = f"skipped ({flag})" if flag else measure_in(tokens, repeats)
        except Exception as e:  # say so and keep the other figures
            got[where] = f"failed: {type(e).__name__}: {str(e)[:500]}"
    for where, result in got.items():
        if isinstance(result, str):
            print(f"{where}: not measured: {result}")
            continue
        for model, (ms, disp, layers) in result.items():
            name = {"llm": "SmolLM2-135M Q4_1 decode, eager", "llm captured": "SmolLM2-135M Q4_1 decode, captured",
                    "whisper": "Whisper tiny.en decoder, eager",
                    "whisper captured": "Whisper tiny.en decoder, captured"}[model]
            print(f"{where:8s} {name:36s} host {ms:7.2f} ms/token  {disp:6.1f} dispatches/token "
                  f"({disp / layers:.1f} per layer, {layers} layers)  ceiling {1e3 / ms:7.1f} tok/s")

    # browser=: Chromium's figure; without Chromium, Node's, labelled "(node)" on the line itself.
    browser = next((where for where in ("chromium", "node") if isinstance(got[where], dict)), None)
    if browser == "node":
        print("browser= below is Pyodide under Node, not Chromium: Chromium was not measured")

    def figures(key):
        nat = got["native"].get(key, got["native"]["llm"])
        if browser is None:
            value = "n/a"
        else:
            value = f"{got[browser].get(key, got[browser]['llm'])[0]:.2f}" + ("(node)" if browser == "node" else "")
        return f"native={nat[0]:.2f} browser={value} dispatches={nat[1]:.0f}"
    print(f"eager host_ms_per_token {figures('llm')}")
    print(f"host_ms_per_token {figures('llm captured')}")


if __name__ == "__main__":
    main()
