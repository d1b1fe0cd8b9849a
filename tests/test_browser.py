"""The web demo in headless Chromium: Pyodide in a module worker, tallow on the
pure-Python backend and on WebGPU (SwiftShader here), the page's flows.

Needs /usr/bin/chromium, web/node_modules/pyodide (`npm ci` in web/) and the
playwright package; skips with the reason otherwise (TALLOW_REQUIRE_BROWSER=1
makes that a failure, for CI). Model flows need the models in the tallow cache
(`tallow fetch whisper-tiny.en smollm2-135m-instruct`). Screenshots go to
test-artifacts/browser/.
"""
import importlib.util
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
ARTIFACTS = os.path.join(REPO_ROOT, "test-artifacts", "browser")
JFK = os.path.join(HERE, "data", "jfk.wav")
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
if os.path.join(HERE, "conformance") not in sys.path:  # cases.py and compare.py import each other by name
    sys.path.insert(0, os.path.join(HERE, "conformance"))
import cases  # noqa: E402  (the conformance op cases, shipped as they are into the page's Pyodide)
from compare import assert_matches  # noqa: E402


def _require(reason):
    if os.environ.get("TALLOW_REQUIRE_BROWSER") == "1":
        pytest.fail(f"TALLOW_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    missing = harness.missing_requirements()
    if missing:
        _require(missing)
    build = harness.load_web_module("build")
    out = str(tmp_path_factory.mktemp("web") / "dist")
    build.build(out, quiet=True)
    return out


@pytest.fixture(scope="module")
def demo(dist):
    with harness.DemoBrowser(dist, artifacts=ARTIFACTS) as d:
        yield d


@pytest.fixture(scope="module")
def demo_page(demo):
    return demo.open()


@pytest.fixture
def ui(demo, demo_page, request):
    """The shared demo page; afterwards a screenshot, and no console errors during the test."""
    seen = len(demo.console)
    yield demo_page
    demo.screenshot(demo_page, request.node.name.replace("/", "_"))
    errors = [e for e in demo.errors() if e in demo.console[seen:]]
    assert not errors, f"console errors during the test: {errors}"


def _model_or_skip(dist, name):
    entry = harness.manifest(dist)["models"][name]
    if entry["missing"]:
        _require(f"{name}: {entry['missing']}")
    return entry


# ---- 1. the conformance op cases inside the browser, on both backends, against numpy/torch ----
@pytest.mark.parametrize("device", ["python", "wgpu"])
@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_op_suite_in_chromium_matches_numpy(name, device, demo, ui, request):
    np = pytest.importorskip("numpy")
    case = cases.CASES[name]
    if case.torch:
        pytest.importorskip("torch")
    info = ui.evaluate("window.tallowDemo.ready")
    reason = case.not_applicable(device)
    if reason:
        pytest.skip(reason)
    if device == "wgpu":
        assert info["device"] == "wgpu", f"WebGPU did not come up in Chromium: {info['gpu_error']}"
    got = demo.run(ui, cases.source(name, device))
    assert_matches(got, case.reference(np), f"{name} on {device}", *case.tolerance(device))


def test_the_page_reports_the_webgpu_adapter(demo, ui):
    info = ui.evaluate("window.tallowDemo.ready")
    assert info["gpu"]["adapter"] and info["gpu"]["f16"] in (True, False)
    text = ui.inner_text("#device")
    assert "WebGPU" in text and info["gpu"]["adapter"] in text
    assert ("emulated on the CPU" in text) == info["gpu"]["cpu_emulated"]


def test_without_webgpu_the_page_says_so_and_uses_pure_python(demo):
    page = demo.open("?cpu")
    try:
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "python" and "gpu" not in info
        assert "not available, running on the CPU fallback" in page.inner_text("#device")
        assert demo.run(page, "import tallow\n(tallow.ones(3, device='python') * 2).tolist()") == [2, 2, 2]
        demo.screenshot(page, "cpu_fallback")
    finally:
        page.close()


# ---- model files: browser storage, bad input -------------------------------------
def test_a_reload_takes_model_files_from_browser_storage(demo, dist, ui):
    entry = _model_or_skip(dist, "whisper-tiny.en")
    first = demo.request(ui, "load", model="whisper-tiny.en", timeout_s=300)
    assert first["bytes"] == entry["bytes"]
    demo.goto(ui)  # a reload: a fresh worker and Python, the same browser profile
    before = len(demo.server.requests)
    again = demo.request(ui, "load", model="whisper-tiny.en", timeout_s=300)
    fetched = [p for p in demo.server.requests[before:] if p.startswith("/models/whisper-tiny.en/")]
    assert fetched == [], f"model files were downloaded again after the reload: {fetched}"
    assert again["from_cache"] == entry["bytes"]


def test_a_corrupt_model_and_a_non_audio_file_show_errors_and_the_page_recovers(demo, dist, ui, tmp_path):
    gguf = _model_or_skip(dist, "smollm2-135m-instruct")["files"][0]
    with open(os.path.join(dist, "models", "smollm2-135m-instruct", gguf["name"]), "rb") as f:
        head = f.read(1 << 20)  # the header and the start of the tensor data: truncated
    corrupt = tmp_path / "truncated.gguf"
    corrupt.write_bytes(head)
    demo.dismiss_error(ui)
    ui.set_input_files("#open-model", str(corrupt))
    ui.wait_for_selector("#error:not([hidden])", timeout=120_000)
    message = ui.inner_text("#error")
    assert "truncated.gguf" in message or "gguf" in message.lower(), message
    demo.screenshot(ui, "corrupt_model")

    text = tmp_path / "notes.txt"
    text.write_text("this is not audio\n" * 100)
    demo.dismiss_error(ui)
    ui.set_input_files("#audio-file", str(text))
    ui.wait_for_selector("#error:not([hidden])", timeout=60_000)
    assert "notes.txt is not an audio file" in ui.inner_text("#error")
    demo.screenshot(ui, "non_audio_file")

    bad_wav = tmp_path / "bad.wav"  # a RIFF/WAVE header that tallow's WAV decoder must refuse
    bad_wav.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x07\x00\x01\x00\x40\x1f\x00\x00"
                        b"\x40\x1f\x00\x00\x01\x00\x08\x00data\x00\x00\x00\x00")
    demo.dismiss_error(ui)
    ui.set_input_files("#audio-file", str(bad_wav))
    ui.wait_for_selector("#error:not([hidden])", timeout=300_000)
    assert "bad" in ui.inner_text("#error").lower() or "wav" in ui.inner_text("#error").lower()
    demo.screenshot(ui, "unsupported_wav")

    # The worker is still usable: Python runs and a valid model loads.
    assert demo.run(ui, "import tallow\n(tallow.arange(4, device='python') + 1).tolist()") == [1, 2, 3, 4]
    assert demo.request(ui, "load", model="smollm2-135m-instruct", timeout_s=300)["kind"] == "llm"


# ---- the real models --------------------------------------------------------------
def _native_greedy_ids(dist, messages, n):
    """tallow on numpy, natively: the reference the browser must reproduce token for token."""
    pytest.importorskip("numpy")
    import tallow
    from tallow.generation import chat
    entry = harness.manifest(dist)["models"]["smollm2-135m-instruct"]
    path = os.path.join(dist, "models", "smollm2-135m-instruct", entry["files"][0]["name"])
    model = tallow.load_model(os.path.realpath(path), device="cpu")
    stream = chat(model, messages, stream=True, max_tokens=n)
    stream.text()
    return list(stream.token_ids)


def _gguf_layout(dist, entry):
    """(bytes of all tensors, bytes of the header) of the demo's GGUF, read natively."""
    import tallow
    with tallow.io.open(os.path.join(dist, "models", "smollm2-135m-instruct", entry["files"][0]["name"])) as f:
        return sum(f.info(name).nbytes for name in f.keys()), f.data_start


def test_smollm2_weights_go_from_the_js_buffer_to_the_gpu_without_entering_the_wasm_heap(demo, dist, ui):
    """The fetched GGUF stays a JS ArrayBuffer: Python reads its header prefix, each tensor is copied
    JS -> GPU buffer in JS, and the wasm heap stays far below the file size (the greedy chat test
    below then runs on the model loaded this way)."""
    entry = _model_or_skip(dist, "smollm2-135m-instruct")
    tensor_bytes, header_bytes = _gguf_layout(dist, entry)
    demo.goto(ui)  # a fresh worker: the wasm heap only grows, so earlier loads must not count
    info = demo.request(ui, "load", model="smollm2-135m-instruct", timeout_s=300)
    print(f"SmolLM2 on WebGPU: loaded in {info['load_s']:.2f} s (Python part {info['seconds']:.2f} s), "
          f"wasm heap {info['heap_bytes'] / 2**20:.0f} MiB, read into Python {info['read_into_python']} bytes, "
          f"JS -> GPU {info['gpu_from_js']} bytes, file {info['weights_bytes']} bytes")
    assert info["device"] == "wgpu" and info["weights_bytes"] == entry["bytes"]
    assert info["gpu_from_js"] == tensor_bytes  # every tensor, quantised ones as their blocks
    assert info["gpu_from_python"] < 2**20  # no weights through Python memory
    assert header_bytes <= info["read_into_python"] <= max(4 * header_bytes, 4 << 20)  # the header prefix only
    assert info["heap_bytes"] < entry["bytes"], "the wasm heap grew to the model's size"


# Files with sizes and offsets that are not multiples of 4, and dtypes widened on the GPU: the direct
# JS -> GPU path (tail copy, raw upload + unpack) must give what the pure-Python backend reads.
_DIRECT_UPLOAD_CASES = r"""
import struct, js, tallow
from tallow.io import JsArrayBufferSource, write_gguf, write_safetensors
from tallow_web_worker import state
q8 = b"".join(b"\x00\x3c" + bytes((i * 7 + b) % 256 for i in range(32)) for b in range(3))  # scale 1.0
halves = struct.pack("<9e", *[0.5 * i - 2 for i in range(9)])
bf16 = b"".join(struct.pack("<f", v)[2:] for v in (1.5, -2.0, 3.25, 0.0, 1e3))
tensors = {"q8": ("q8_0", (3, 32), q8), "h": ("f16", (3, 3), halves), "b": ("bf16", (5,), bf16),
           "i": ("i8", (11,), bytes(range(250, 256)) + bytes(range(5))), "u": ("u8", (7,), bytes(range(100, 107))),
           "t": ("bool", (5,), bytes([0, 1, 0, 2, 1])), "f": ("f32", (3,), struct.pack("<3f", 1.0, -0.5, 7.0))}
out = {}
for kind in ("gguf", "safetensors"):
    chosen = {k: v for k, v in tensors.items() if (k in ("q8", "h", "i", "f") if kind == "gguf" else k != "q8")}
    path = f"/tmp/direct.{kind}"
    (write_gguf if kind == "gguf" else write_safetensors)(path, chosen)
    data = open(path, "rb").read()
    buf = js.Uint8Array.new(len(data))
    buf.assign(data)
    f = tallow.io.open(JsArrayBufferSource(buf, path))
    before = state["driver"].bytes_from_js
    for name in chosen:
        gpu, cpu = f.tensor(name, "wgpu"), f.tensor(name, "python")
        same = bytes(gpu) == bytes(cpu) if gpu.dtype.is_quantized else gpu.tolist() == cpu.tolist()
        out[f"{kind}:{name}"] = [same, gpu.dtype.name, f.info(name).offset % 4, f.info(name).nbytes % 4]
    out[f"{kind}:js_bytes"] = [state["driver"].bytes_from_js - before, sum(f.info(n).nbytes for n in chosen)]
out
"""


def test_direct_js_to_gpu_uploads_of_odd_sizes_and_widened_dtypes_match_the_python_backend(demo, ui):
    if ui.evaluate("window.tallowDemo.ready")["device"] != "wgpu":
        pytest.fail("WebGPU did not come up in Chromium")
    got = demo.run(ui, _DIRECT_UPLOAD_CASES)
    for kind in ("gguf", "safetensors"):
        moved, total = got.pop(f"{kind}:js_bytes")
        assert moved == total, f"{kind}: {moved} of {total} bytes went JS -> GPU directly"
    wrong = {k: v for k, v in got.items() if not v[0]}
    assert not wrong, f"direct uploads that differ from the Python backend: {wrong}"
    assert any(v[3] for v in got.values()) and any(v[2] for k, v in got.items() if k.startswith("safetensors"))


def test_without_webgpu_the_weights_are_read_from_the_js_buffer_through_python(demo, dist):
    """The CPU fallback (pure Python) takes every tensor through the source's read()."""
    entry = _model_or_skip(dist, "smollm2-135m-instruct")
    tensor_bytes, header_bytes = _gguf_layout(dist, entry)
    page = demo.open("?cpu")
    try:
        info = demo.request(page, "load", model="smollm2-135m-instruct", timeout_s=300)
        assert info["device"] == "python" and info["gpu_from_js"] == 0
        header_read = info["read_into_python"] - tensor_bytes  # every tensor once, plus the header prefix
        assert header_bytes <= header_read <= max(4 * header_bytes, 4 << 20)
    finally:
        page.close()


def test_smollm2_streams_its_greedy_reply_like_native_tallow(demo, dist, ui):
    _model_or_skip(dist, "smollm2-135m-instruct")
    prompt = "Name three colours of the rainbow."
    ui.fill("#max-tokens", "16")
    ui.fill("#chat-input", prompt)
    started = time.perf_counter()
    ui.click("#send")
    ui.wait_for_selector(".assistant[data-done]", timeout=420_000)
    assert not ui.is_visible("#error"), ui.inner_text("#error")
    stats = ui.inner_text("#chat-stats")
    reply = ui.locator(".assistant").last.inner_text()
    result_ids = demo.run(ui, "import tallow_web_worker as w\nw.state['last_chat_ids']")
    print(f"browser chat: {time.perf_counter() - started:.1f} s, {stats}")
    assert len(result_ids) >= 16 and reply.strip()
    assert result_ids == _native_greedy_ids(dist, [{"role": "user", "content": prompt}], 16)


def test_the_stop_button_ends_generation_between_tokens(demo, dist, ui):
    _model_or_skip(dist, "smollm2-135m-instruct")
    ui.fill("#max-tokens", "200")
    ui.fill("#chat-input", "Write a long story about a lighthouse keeper.")
    ui.click("#send")
    ui.wait_for_function("document.querySelectorAll('.assistant').length && "
                         "[...document.querySelectorAll('.assistant')].pop().textContent.length > 0", timeout=300_000)
    ui.click("#stop")
    ui.wait_for_selector(".assistant[data-done]:last-of-type", timeout=120_000)
    ids = demo.run(ui, "import tallow_web_worker as w\nw.state['last_chat_ids']")
    assert ui.inner_text("#status") == "Stopped."
    assert 1 <= len(ids) < 40, f"{len(ids)} tokens after Stop"


def test_whisper_transcribes_jfk_through_the_file_input(demo, dist, ui):
    """On WebGPU (about a minute on SwiftShader). Without timestamp tokens tiny.en gives the exact
    sentence; with them it drops the comma after "for you", exactly as transformers does."""
    _model_or_skip(dist, "whisper-tiny.en")
    demo.dismiss_error(ui)
    ui.uncheck("#timestamps")
    try:
        ui.set_input_files("#audio-file", JFK)
        text, error = demo.wait_for_text(ui, "#transcript", timeout_s=900)
    finally:
        ui.check("#timestamps")
    assert not error, error
    assert text == JFK_TEXT
    segments = ui.locator("#segments li").all_inner_texts()
    stats = ui.inner_text("#speech-stats")
    assert len(segments) == 1 and segments[0].startswith("[0.00 → ") and "real-time factor" in stats
    assert "(on wgpu)" in stats, stats


# ---- byte-range sources: what the browser loads weights through (no browser needed) ----
def _gguf_with_big_header(path):
    """A GGUF whose header (a 20k-word vocabulary) is far longer than a small first prefix, with
    tensors whose sizes are not multiples of 4 (q8_0: 34-byte blocks) next to plain ones."""
    np = pytest.importorskip("numpy")
    from tallow.io import write_gguf
    rng = np.random.default_rng(0)
    q8 = rng.integers(0, 256, size=3 * 34, dtype=np.uint8)
    q8[0::34], q8[1::34] = 0, 0x3C  # f16 scale 1.0 in every block
    tensors = {"w.f32": rng.standard_normal((5, 7)).astype(np.float32),
               "w.q8_0": ("q8_0", (3, 32), q8.tobytes()),
               "w.f16": rng.standard_normal((3, 3)).astype(np.float16),
               "w.i8": rng.integers(-128, 128, size=(11,), dtype=np.int8)}
    words = [f"word{i}" for i in range(20000)]
    write_gguf(path, tensors, {"general.architecture": "test", "tokenizer.ggml.tokens": words})
    return tensors, words


def test_a_gguf_over_a_byte_source_reads_only_its_header_and_matches_the_mapped_file(tmp_path, monkeypatch):
    import tallow
    from tallow.io import BytesSource, gguf
    path = str(tmp_path / "big_header.gguf")
    tensors, words = _gguf_with_big_header(path)
    monkeypatch.setattr(gguf, "FIRST_PREFIX", 4096)  # forces the prefix to be re-read longer, twice or more
    data = open(path, "rb").read()
    source = BytesSource(data, "big_header.gguf")
    f = tallow.io.open(source)
    mapped = tallow.io.open(path)
    assert isinstance(f, gguf.GGUFFile) and f.metadata == mapped.metadata and f.metadata["tokenizer.ggml.tokens"] == words
    assert {n: repr(i) for n, i in f.infos.items()} == {n: repr(i) for n, i in mapped.infos.items()}
    header_end = f.data_start
    assert source.bytes_read < 5 * header_end, (source.bytes_read, header_end)  # the header (re-read), no tensor data
    for name in tensors:
        before = source.bytes_read
        assert bytes(f.raw(name)) == bytes(mapped.raw(name))
        assert source.bytes_read - before == f.info(name).nbytes
        got, want = f.tensor(name, device="python"), mapped.tensor(name, device="python")
        assert bytes(got) == bytes(want) and got.dtype == want.dtype and got.shape == want.shape


def test_a_safetensors_over_a_byte_source_matches_the_mapped_file(tmp_path):
    np = pytest.importorskip("numpy")
    import tallow
    from tallow.io import BytesSource, write_safetensors
    rng = np.random.default_rng(1)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float16), "b": rng.integers(0, 2, (7,)).astype(bool),
               "c": rng.standard_normal((4,)).astype(np.float32)}
    path = str(tmp_path / "m.safetensors")
    write_safetensors(path, tensors, {"format": "pt"})
    source = BytesSource(open(path, "rb").read(), "m.safetensors")
    f, mapped = tallow.io.open(source), tallow.io.open(path)
    assert f.metadata == {"format": "pt"} and f.keys() == mapped.keys()
    assert source.bytes_read == 8 + 4 + (f.info("a").offset - 8)  # sniff, length, JSON header: no data
    for name, arr in tensors.items():
        np.testing.assert_array_equal(np.array(f.tensor(name, device="python").tolist(), dtype=arr.dtype), arr)


@pytest.mark.parametrize("cut", [3, 100, 2000, -25])  # -25: inside the last tensor
def test_a_truncated_file_over_a_byte_source_fails_like_the_mapped_one(tmp_path, monkeypatch, cut):
    import tallow
    from tallow.errors import FormatError
    from tallow.io import BytesSource, gguf
    path = str(tmp_path / "big_header.gguf")
    _gguf_with_big_header(path)
    monkeypatch.setattr(gguf, "FIRST_PREFIX", 1024)
    data = open(path, "rb").read()[:cut]
    with open(path, "wb") as out:
        out.write(data)
    with pytest.raises(FormatError) as mapped_error:
        tallow.io.open(path, format="gguf")
    with pytest.raises(FormatError) as source_error:
        tallow.io.open(BytesSource(data, path), format="gguf")
    assert str(source_error.value) == str(mapped_error.value)
