"""The wasm device as the page's device (issue 31, docs/wasm.md "The page's device choice"): in a
Chromium without WebGPU (--disable-webgpu: navigator.gpu is there, requestAdapter() resolves
null) the page boots on kernels.wasm through BrowserWasmDriver, its SmolLM2-135M Q4_1 weights go
from the site's sliced files into the module's memory in JS, and the page's greedy chat gives
the token ids tallow gives natively on the CPU (numpy) device; Whisper tiny.en transcribes jfk.wav
to the exact sentence there. Needs what tests/test_browser.py needs, and the models in the tallow
cache (`tallow fetch smollm2-135m-instruct whisper-tiny.en`)."""
import importlib.util
import json
import os
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(os.path.dirname(HERE), "test-artifacts", "browser")
pytestmark = [pytest.mark.browser, pytest.mark.models]
MODEL = "smollm2-135m-instruct"
TOO_LARGE = "too-large-for-wasm"
JFK = os.path.join(HERE, "data", "jfk.wav")
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def _harness():
    spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _harness()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    harness.require_browser()
    dist = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(dist, part_bytes=30 * 10**6)
    entry = harness.manifest(dist)["models"][MODEL]
    if entry["missing"]:
        harness.require_browser(f"{MODEL}: {entry['missing']}")
    # a model past wasm32's 4 GiB in the manifest, whose file the site does not have: the page
    # must refuse it from its size before fetching anything
    listed = harness.manifest(dist)
    listed["models"][TOO_LARGE] = {**entry, "title": "A 4.92 GB model", "bytes": 4_920_000_000, "files": [
        {"name": "big.gguf", "url": f"models/{TOO_LARGE}/big.gguf", "size": 4_920_000_000}]}
    with open(os.path.join(dist, "models", "manifest.json"), "w") as f:
        json.dump(listed, f)
    with harness.DemoBrowser(dist, artifacts=ARTIFACTS) as d:
        yield d


@pytest.fixture(scope="module")
def nogpu(demo):
    """A page in a Chromium without WebGPU (a real null adapter), booted."""
    with demo.other_browser(["--disable-webgpu"], without=["--enable-unsafe-webgpu"]) as browser:
        page = browser.new_page()
        demo.watch(page)
        demo.goto(page)
        yield page


def _native_greedy(demo, messages, n):
    pytest.importorskip("numpy")
    import tallow
    from tallow.generation import chat
    entry = harness.manifest(demo.dist)["models"][MODEL]
    path = os.path.join(harness.load_web_module("build")._tallow_home(), MODEL, entry["files"][0]["name"])
    stream = chat(tallow.load_model(path, device="cpu"), messages, stream=True, max_tokens=n)
    stream.text()
    with tallow.io.open(path) as f:
        tensor_bytes = sum(f.info(name).nbytes for name in f.keys())
    return list(stream.token_ids), tensor_bytes


def test_without_webgpu_the_page_chats_on_the_wasm_device_with_the_native_greedy_ids(demo, nogpu):
    prompt = "Name three colours of the rainbow."
    native_ids, tensor_bytes = _native_greedy(demo, [{"role": "user", "content": prompt}], 16)
    page = nogpu
    seen = len(demo.console)
    info = page.evaluate("window.tallowDemo.ready")
    assert info["device"] == "wasm" and "gpu" not in info and info["wasm_error"] is None, info
    assert info["gpu_error"].startswith("no WebGPU adapter"), info
    assert info["cpu_speed"]["device"] == "wasm" and info["cpu_speed"]["flops_per_s"] > 0
    device = page.inner_text("#device")
    assert "CPU (WebAssembly SIMD)" in device and "small matmuls on the CPU (WebAssembly SIMD)" in device
    load = demo.request(page, "load", model=MODEL, timeout_s=300)
    assert load["device"] == "wasm", load
    # every tensor went from the site's sliced files into the module's memory in JS; Python
    # read the header (and, for the prompt-sized tables the model builds, wrote far less)
    assert load["gpu_from_js"] == tensor_bytes, (load, tensor_bytes)
    assert load["read_into_python"] < (8 << 20) and load["gpu_from_python"] < tensor_bytes // 4, load
    page.fill("#max-tokens", "16")
    page.fill("#chat-input", prompt)
    started = time.perf_counter()
    page.click("#send")
    page.wait_for_selector(".assistant[data-done]", timeout=300_000)
    assert not page.is_visible("#error"), page.inner_text("#error")
    stats = page.inner_text("#chat-stats")
    ids = demo.run(page, "import tallow_web_worker as w\nw.state['last_chat_ids']")
    replays, memory = demo.run(page, "import tallow\nb = tallow.Device('wasm').backend\n"
                                     "[b.replays, b.driver._js.memoryBytes()]")
    file_bytes = harness.manifest(demo.dist)["models"][MODEL]["bytes"]
    print(f"page chat on wasm: {time.perf_counter() - started:.1f} s, {stats}; {replays} replays, "
          f"wasm memory {memory / 1e6:.1f} MB for {tensor_bytes / 1e6:.1f} MB of tensors "
          f"({memory / file_bytes:.2f}x the {file_bytes / 1e6:.1f} MB file)")
    assert ids == native_ids
    # the weights held once (issue 31): the page loaded the model twice (the request above, then
    # the chat's own load), the second into the first one's memory
    assert memory <= 1.2 * file_bytes, (memory, file_bytes)
    assert replays >= 16 - 3  # decoded by replaying the captured step: one `run` call a token
    errors = [e for e in demo.errors() if e in demo.console[seen:]]
    assert not errors, errors


def test_without_webgpu_whisper_transcribes_jfk_on_the_wasm_device(demo, nogpu):
    """Whisper tiny.en through the page's file input, without timestamp tokens: the exact sentence."""
    if harness.manifest(demo.dist)["models"]["whisper-tiny.en"]["missing"]:
        harness.require_browser("whisper-tiny.en is not in the tallow cache")
    page = nogpu
    seen = len(demo.console)
    page.uncheck("#timestamps")
    started = time.perf_counter()
    page.set_input_files("#audio-file", JFK)
    text, error = demo.wait_for_text(page, "#transcript[data-done]", timeout_s=600)
    stats = page.inner_text("#speech-stats")
    print(f"page jfk on wasm: {time.perf_counter() - started:.1f} s, {stats}")
    assert not error, error
    assert text == JFK_TEXT
    errors = [e for e in demo.errors() if e in demo.console[seen:]]
    assert not errors, errors


def test_a_model_too_large_for_wasm32_is_refused_before_its_download(demo, nogpu):
    with pytest.raises(Exception) as refused:
        demo.request(nogpu, "load", model=TOO_LARGE, timeout_s=60)
    message = str(refused.value)
    # (the site has no such file: a fetch would have failed with a 404 instead)
    assert "A 4.92 GB model (4.92 GB) is too large for this browser's WebAssembly device" in message, message
    assert "4 GiB" in message and "smaller quantisation" in message and "WebGPU" in message, message
