"""Host time per decoded token on the GPU path, with a driver that does nothing.

    python bench/gpu_host.py [--tokens N] [--no-pyodide]

The wgpu backend runs over wgpu_backend/driver_null.py: every driver call
returns at once, so the GPU costs zero and what is timed is tallow's own
Python per token (kernel choice, shape checks, parameter packing). That is the
ceiling on tokens/s no GPU can lift. Measured for SmolLM2-135M-Instruct
(Q4_1) one-token decode and for Whisper tiny.en's decoder (one token per step,
the KV cache growing, cross-attention over 1500 audio frames), natively and
inside Pyodide (the same wasm CPython the browser runs; here under Node's V8,
not Chromium: the Python work is the same, the JS driver is absent by design).

Each is measured eager (every op through tallow's front end) and captured
(tallow.capture: the step recorded once, then replayed; CausalLM does this for
one-token steps on wgpu, and Whisper's decode_step for one token per row).
The last line is `host_ms_per_token native=X browser=Y dispatches=Z` for the
SmolLM2 decode, captured where capture works there (browser: the Pyodide figure;
n/a when node or the pyodide package is missing); the eager figures are on the
line above it.
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


def native(tokens):
    scope = {}
    exec(MEASURE, scope)
    gguf, whisper = _model_paths()
    return scope["measure"](gguf, whisper, tokens)


def pyodide(tokens):
    """The same measurement inside Pyodide (Node), or a reason it could not run."""
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
        return runner.run(MEASURE + "\n" + code, timeout=900)


def main():
    tokens = int(sys.argv[sys.argv.index("--tokens") + 1]) if "--tokens" in sys.argv else 20
    got = {"native": native(tokens)}
    got["pyodide"] = "skipped (--no-pyodide)" if "--no-pyodide" in sys.argv else pyodide(tokens)
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

    def figures(key):
        pyo = got["pyodide"]
        nat = got["native"].get(key, got["native"]["llm"])
        browser = f"{pyo.get(key, pyo['llm'])[0]:.2f}" if isinstance(pyo, dict) else "n/a"
        return f"native={nat[0]:.2f} browser={browser} dispatches={nat[1]:.0f}"
    print(f"eager host_ms_per_token {figures('llm')}")
    print(f"host_ms_per_token {figures('llm captured')}")


if __name__ == "__main__":
    main()
