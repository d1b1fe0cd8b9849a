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
# With timestamp tokens tiny.en drops the comma after "for you", exactly as transformers does.
JFK_TEXT_TIMESTAMPS = JFK_TEXT.replace("for you,", "for you")
# The test site splits every model file over 30 MB into parts (both weights files here), so every
# model flow below also checks that the worker joins the parts right.
PART_BYTES = 30 * 10**6

pytestmark = pytest.mark.browser


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


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    harness.require_browser()
    out = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(out, part_bytes=PART_BYTES)
    return out


def _cache_file(model, name):
    """The original file in the tallow cache (the site holds it in parts): native references read it."""
    return os.path.join(harness.load_web_module("build")._tallow_home(), model, name)


@pytest.fixture(scope="module")
def demo(dist):
    with harness.DemoBrowser(dist, artifacts=ARTIFACTS) as d:
        yield d


# Chromium here has WebGPU only on SwiftShader, a software adapter, which the page's automatic
# choice passes over for the wasm device: the shared page asks for WebGPU, to test that path.
WGPU = "?device=wgpu"


@pytest.fixture(scope="module")
def demo_page(demo):
    return demo.open(WGPU)


def _device_name(info):
    """What the page calls its device in status lines (app.js's deviceName)."""
    return {"wgpu": "WebGPU", "wasm": "the CPU (WebAssembly SIMD)", "cpu": "the CPU (numpy)"}.get(
        info["device"], "the CPU (pure Python)")


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
        harness.require_browser(f"{name}: {entry['missing']}")
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
    if device == "wgpu":
        assert info["device"] == "wgpu", f"WebGPU did not come up in Chromium: {info['gpu_error']}"
    if reason:  # e.g. f64 on WebGPU: refused with an UnsupportedError naming it, never narrowed
        refusal = demo.run(ui, cases.source(name, device, "refusal"))
        assert refusal and "f64" in refusal, f"{name} on {device}: {reason}, yet it gave {refusal!r}"
        return
    got = demo.run(ui, cases.source(name, device))
    assert_matches(got, case.reference(np), f"{name} on {device}", *case.tolerance(device))


def test_the_page_reports_the_webgpu_adapter(demo, ui):
    info = ui.evaluate("window.tallowDemo.ready")
    assert info["gpu"]["adapter"] and info["gpu"]["f16"] in (True, False)
    text = ui.inner_text("#device")
    assert "WebGPU" in text and info["gpu"]["adapter"] in text
    assert ("emulated on the CPU" in text) == info["gpu"]["cpu_emulated"]


def test_without_webgpu_the_page_says_so_and_uses_pure_python(demo):
    """?cpu: the page measures the CPU at boot and says up front how slow each model will be; a
    request made while another runs is acknowledged as queued next to the control that made it."""
    page = demo.open("?cpu")
    try:
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "python" and "gpu" not in info
        assert info["cpu_speed"]["flops_per_s"] > 0
        assert "not available, running on the CPU fallback" in page.inner_text("#device")
        assert "MFLOP/s (measured" in page.inner_text("#device")
        note = page.inner_text("#cpu-note")
        assert page.is_visible("#cpu-note") and "30 s of speech takes about" in note and "64-token reply takes about" in note
        assert "No WebGPU" in page.inner_text("#speech-status") and "No WebGPU" in page.inner_text("#chat-status")
        assert demo.run(page, "import tallow\n(tallow.ones(3, device='python') * 2).tolist()") == [2, 2, 2]
        # keep the worker busy for a few seconds, then ask for speech: the panel says it is queued
        page.evaluate("() => { window.tallowDemo.request('run', {code: 'import time\\ntime.sleep(4)\\n1'}); }")
        page.click("#example")
        page.wait_for_function("document.getElementById('speech-status').textContent.startsWith('Queued behind 1')",
                               timeout=10_000)
        demo.screenshot(page, "cpu_fallback")
        # a picked file (the example clip is posted as a File) gets an estimate once the worker has
        # read its duration, then says what the window is doing
        demo.record_texts(page, "#speech-status")
        page.wait_for_function("document.getElementById('speech-status').textContent.includes('listening to the next')",
                               timeout=300_000)
        texts = demo.recorded_texts(page, "#speech-status")
        estimate = [t for t in texts if t.startswith("Transcribing jfk.wav (11 s of audio): about ")]
        assert estimate and estimate[0].endswith(" on the CPU (pure Python)…"), texts
        assert "Transcribing jfk.wav: 0 of 11 s of audio done, about " in texts[-1], texts
    finally:
        page.close()  # ends the worker: the pure-Python transcription is not waited for


# Chrome on Linux without a GPU driver: navigator.gpu exists but requestAdapter() resolves null.
# The worker's Python asks for the adapter and init scripts do not reach workers, so worker.mjs is
# served with the same override in front of it.
NO_ADAPTER = "if (self.navigator && navigator.gpu) navigator.gpu.requestAdapter = async () => null;\n"
# Older Safari and Firefox: no navigator.gpu at all (a getter of the worker's navigator that answers undefined).
NO_WEBGPU = ("if (self.WorkerNavigator) Object.defineProperty(WorkerNavigator.prototype, 'gpu', {get: () => undefined});\n"
             "if (self.Navigator) Object.defineProperty(Navigator.prototype, 'gpu', {get: () => undefined});\n")


@pytest.mark.parametrize("query", ["", "?device=wgpu"])
@pytest.mark.parametrize("override, says", [(NO_ADAPTER, "no WebGPU adapter (navigator.gpu.requestAdapter() found none"),
                                            (NO_WEBGPU, "this browser has no WebGPU (navigator.gpu is missing)")],
                         ids=["null_adapter", "no_navigator_gpu"])
def test_webgpu_without_an_adapter_runs_on_the_cpu_and_says_so_without_an_error(demo, query, override, says):
    """Also when the page is told to use WebGPU (?device=wgpu): the CPU (the wasm device, kernels.wasm),
    and the reason shown."""
    page = demo.context.new_page()
    demo.watch(page)
    page.add_init_script(override)

    def with_override(route):
        response = route.fetch()
        route.fulfill(response=response, body=override + response.text())

    page.route("**/worker.mjs*", with_override)
    seen = len(demo.console)
    try:
        demo.goto(page, query)
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "wasm" and "gpu" not in info and info["cpu_speed"]["flops_per_s"] > 0
        assert info["cpu_speed"]["device"] == "wasm" and info["wasm_error"] is None
        assert info["gpu_error"].startswith(says), info
        if query:
            assert info["device_note"].startswith(f"?device=wgpu: WebGPU is not usable here ({says}")
            assert "?device=wgpu: WebGPU is not usable here" in page.inner_text("#device")
        has_gpu = demo.run(page, "import js\ngetattr(js.navigator, 'gpu', None) is not None")
        assert has_gpu is (override == NO_ADAPTER)  # the null adapter: WebGPU is there, its adapter is not
        device = page.inner_text("#device")
        assert f"not available, running on the CPU fallback: {says}" in device and "Error" not in device
        assert page.is_hidden("#error") and page.inner_text("#speech-status").startswith("No WebGPU: on this CPU")
        assert demo.run(page, "import tallow\n(tallow.ones(2, device='python') + 1).tolist()") == [2, 2]
        errors = [e for e in demo.errors() if e in demo.console[seen:]]
        assert not errors, errors
    finally:
        page.close()


def test_device_python_overrides_webgpu_and_the_estimate_is_measured_there(demo):
    """?device=python on a browser with WebGPU: the page computes in pure Python, and the speed it
    estimates from is measured on that device."""
    page = demo.open("?device=python")
    try:
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "python" and info["requested"] == "python" and info["device_note"] is None
        assert "gpu" not in info and info["gpu_error"] is None  # WebGPU was not asked for
        assert info["cpu_speed"]["device"] == "python" and info["cpu_speed"]["flops_per_s"] > 0
        assert "small matmuls on the CPU (pure Python)" in page.inner_text("#device")
        assert page.is_visible("#cpu-note") and "computes on the CPU (pure Python)" in page.inner_text("#cpu-note")
        assert demo.run(page, "import tallow\n(tallow.ones(2) + 1).tolist()") == [2, 2]
        assert page.is_hidden("#error")
    finally:
        page.close()


def test_device_wasm_overrides_webgpu_and_runs_on_kernels_wasm(demo):
    """?device=wasm on a browser with WebGPU: the page computes on the wasm device (BrowserWasmDriver
    over kernels.wasm), measures its speed estimate there, and an op it has no kernel for is a clear
    UnsupportedError naming the device, not a hang."""
    page = demo.open("?device=wasm")
    try:
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "wasm" and info["device_note"] is None and "gpu" not in info, info
        assert info["cpu_speed"]["device"] == "wasm" and page.is_hidden("#error")
        assert "CPU (WebAssembly SIMD)" in page.inner_text("#device")
        assert demo.run(page, "import tallow\nx = tallow.tensor([[0.0, 1, 2], [3, 4, 5]], device='wasm')\n"
                              "(x @ tallow.ones(3, 2, device='wasm') + 1).tolist()") == [[4, 4], [13, 13]]
        said = demo.run(page, "import tallow\ntry:\n    tallow.ones(4, device='wasm').cumsum(0).tolist()\n"
                              "    said = None\nexcept tallow.errors.UnsupportedError as e:\n    said = str(e)\nsaid")
        assert said and "wasm device" in said, said
    finally:
        page.close()


def test_a_software_webgpu_adapter_gets_a_cpu_speed_estimate(demo, ui):
    """SwiftShader (what Chromium gives a machine without a GPU driver) computes on the CPU: the
    page measures its speed on the chosen device and warns as it does without WebGPU."""
    info = ui.evaluate("window.tallowDemo.ready")
    assert info["device"] == "wgpu", info["gpu_error"]
    if not info["gpu"]["cpu_emulated"]:
        pytest.skip(f"a hardware adapter ({info['gpu']['adapter']}): no estimate is shown for it")
    assert info["measure_speed"] and info["cpu_speed"]["device"] == "wgpu" and info["cpu_speed"]["flops_per_s"] > 0
    assert "small matmuls on WebGPU" in ui.inner_text("#device")
    note = ui.inner_text("#cpu-note")
    assert ui.is_visible("#cpu-note") and "WebGPU here is emulated on the CPU" in note and "64-token reply takes about" in note


def test_a_software_webgpu_adapter_is_passed_over_for_the_wasm_device_and_the_page_says_why(demo):
    """The automatic choice (no ?device=) on SwiftShader: the wasm device, which is faster on a
    CPU; the adapter is still shown, the device note says why it was passed over, and the speed
    estimate is measured on the wasm device."""
    page = demo.open()
    try:
        info = page.evaluate("window.tallowDemo.ready")
        if not info.get("gpu", {}).get("cpu_emulated", True):
            pytest.skip(f"a hardware adapter ({info['gpu']['adapter']}): WebGPU is the automatic choice")
        assert info["device"] == "wasm" and info["requested"] == "auto" and info["wasm_error"] is None, info
        assert info["gpu"]["cpu_emulated"] and info["gpu_error"] is None, info
        assert info["device_note"] == (f"WebGPU's adapter here ({info['gpu']['adapter']}) is a software one that "
                                       "computes on the CPU: running on the CPU (WebAssembly SIMD), which is "
                                       "faster there; ?device=wgpu uses the adapter anyway")
        assert info["measure_speed"] and info["cpu_speed"]["device"] == "wasm" and info["cpu_speed"]["flops_per_s"] > 0
        shown = page.inner_text("#device")
        assert "CPU (WebAssembly SIMD)" in shown and f"{info['gpu']['adapter']}" in shown, shown
        assert "emulated on the CPU" in shown and info["device_note"] in shown and "small matmuls on the CPU (WebAssembly SIMD)" in shown
        note = page.inner_text("#cpu-note")
        assert page.is_visible("#cpu-note") and note.startswith(
            "WebGPU here is emulated on the CPU, so this page computes on the CPU (WebAssembly SIMD).")
        assert page.inner_text("#chat-status").startswith("WebGPU is emulated on the CPU here: on this CPU a 64-token")
        # the adapter stays usable by name
        assert demo.run(page, "import tallow\n[tallow.Device('wgpu').backend.driver.name, "
                              "(tallow.ones(2, device='wgpu') + 1).tolist()]") == ["browser", [2, 2]]
        assert page.is_hidden("#error")
    finally:
        page.close()


def test_chromium_with_webgpu_disabled_boots_on_the_cpu(demo):
    """Chromium's --disable-webgpu (without --enable-unsafe-webgpu) keeps navigator.gpu, and its
    requestAdapter() resolves null, as on Linux without a GPU driver: the real null adapter, not a
    stub. The page runs on the CPU (the wasm device), says why, and shows no error."""
    with demo.other_browser(["--disable-webgpu"], without=["--enable-unsafe-webgpu"]) as browser:
        page = browser.new_page()
        demo.watch(page)
        seen = len(demo.console)
        demo.goto(page)
        info = page.evaluate("window.tallowDemo.ready")
        assert info["device"] == "wasm" and "gpu" not in info, info
        assert info["gpu_error"].startswith("no WebGPU adapter (navigator.gpu.requestAdapter() found none"), info
        assert info["cpu_speed"]["device"] == "wasm" and info["cpu_speed"]["flops_per_s"] > 0
        assert "not available, running on the CPU fallback: no WebGPU adapter" in page.inner_text("#device")
        assert page.is_hidden("#error") and page.is_visible("#cpu-note")
        errors = [e for e in demo.errors() if e in demo.console[seen:]]
        assert not errors, errors


WASM_DRIVER_CASES = os.path.join(HERE, "wasm_driver_cases.py")


def test_the_wasm_driver_in_the_page_replays_a_step_and_takes_weights_from_slices(demo, ui):
    """The wasm device's browser driver (kernels.wasm over a WebAssembly.Memory owned by JS): the
    shared driver case (tests/wasm_driver_cases.py, as WasmtimeDriver passes it natively) against
    a float64 reference, and bytes written from a sliced JS file (SlicedFile's interface: 7-byte
    slices here) straight into its memory."""
    with open(WASM_DRIVER_CASES) as f:
        cases_text = f.read()
    code = cases_text + """
import js
from pyodide.ffi import to_js
from tallow.backends.wasm.driver_browser import create_wasm_driver
driver = await create_wasm_driver()
att, ks, q = recorded_step_replays_like_its_eager_launches(driver)
data = bytes(range(256)) * 2
sliced = js.Function("bytes", "return {sliceBytes: 7, read: async (o, n) => bytes.subarray(o, o + n)}")(to_js(data))
buf = driver.alloc_bytes(40)
await driver.write_from_slices(buf, 3, sliced, 5, 30)
[driver.name, close(att, attention_reference(ks, q)), driver.download(buf, 0, 40) == bytes(3) + data[5:35] + bytes(7),
 huge_buffer_is_refused(driver)]
"""
    assert demo.run(ui, code) == ["browser", True, True, True]


def test_boot_shows_the_runtime_download_in_mb_and_enables_controls_when_ready(demo):
    page = demo.context.new_page()
    demo.watch(page)
    page.add_init_script("""document.addEventListener('DOMContentLoaded', () => {
        const status = document.getElementById('status');
        window.__boot = {disabledAtStart: ['example', 'send', 'chat-input', 'audio-file', 'record']
                           .filter((id) => document.getElementById(id).disabled), texts: []};
        new MutationObserver(() => window.__boot.texts.push(status.textContent))
            .observe(status, {childList: true, characterData: true, subtree: true});
    });""")
    try:
        demo.goto(page)
        boot = page.evaluate("window.__boot")
        site = page.evaluate("fetch('site.json').then((r) => r.json())")
        assert boot["disabledAtStart"] == ["example", "send", "chat-input", "audio-file", "record"]
        downloads = [t for t in boot["texts"] if t.startswith("Downloading the Python runtime")]
        assert downloads and downloads[-1].endswith(f"of {site['runtime_bytes'] / 1e6:.1f} MB"), boot["texts"]
        info = page.evaluate("window.tallowDemo.ready")
        assert info["runtime_bytes"] == site["runtime_bytes"]  # every counted byte, no more
        assert page.inner_text("#status").startswith("Ready in") and not page.is_disabled("#example")
    finally:
        page.close()


def _named_controls(snapshot):
    """(role, name) of every control in an aria snapshot (Playwright's YAML)."""
    import re
    found = []
    for line in snapshot.splitlines():
        m = re.match(r'\s*- (button|textbox|checkbox|spinbutton|combobox|slider)(?: "((?:[^"\\]|\\.)*)")?', line)
        if m:
            found.append((m[1], m[2] or ""))
    return found


def test_at_phone_width_controls_have_unique_names_the_chat_log_is_live_and_nothing_overflows(demo, tmp_path):
    page = demo.open(viewport={"width": 390, "height": 844})
    try:
        controls = _named_controls(page.locator("body").aria_snapshot())
        assert len(controls) >= 12, controls
        unnamed = [c for c in controls if not c[1].strip()]
        assert not unnamed, f"controls without an accessible name: {unnamed}"
        repeated = sorted({c for c in controls if controls.count(c) > 1})
        assert not repeated, f"controls sharing a name: {repeated}"
        for role, name in controls:  # and each name finds exactly that one control
            assert page.get_by_role(role, name=name, exact=True).count() == 1, (role, name)
        assert page.get_by_role("textbox", name="Message to the model", exact=True).count() == 1
        assert page.get_by_role("button", name="Load Whisper tiny.en (speech to text)", exact=True).count() == 1
        assert page.get_attribute("#chat-log", "aria-live") == "polite" and page.get_attribute("#chat-log", "role") == "log"
        assert page.get_attribute("#speech-status", "aria-live") == "polite"
        width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], f"horizontal overflow at 390 px: {width}"
        assert demo.axe_violations(page) == []
        # the two open-from-disk inputs: each under its own label, side by side with nothing, on screen
        label_model, label_folder = (page.locator(f'label[for="{i}"]').bounding_box() for i in ("open-model", "open-folder"))
        box_model, box_folder = (page.locator(f"#{i}").bounding_box() for i in ("open-model", "open-folder"))
        assert label_model["y"] + label_model["height"] <= box_model["y"] + 1, (label_model, box_model)
        assert box_model["y"] + box_model["height"] <= label_folder["y"] + 1, (box_model, label_folder)
        assert label_folder["y"] + label_folder["height"] <= box_folder["y"] + 1, (label_folder, box_folder)
        assert all(b["x"] + b["width"] <= 390 for b in (label_model, label_folder, box_model, box_folder))
        # a long model name (a loaded one, or one opened from disk) shortens the select, not the page
        page.evaluate("""document.getElementById('chat-model').append(new Option(
            'a-model-opened-from-disk-with-a-very-long-name.Q4_K_M.gguf (from disk) — 4321.0 MB (loaded)', 'long'))""")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"horizontal overflow at 390 px with a long model name: {width}"
        page.evaluate("document.querySelector('#chat-model option[value=long]').remove()")
        # the speech panel's status sits with its controls: both on screen together
        page.locator("#example").scroll_into_view_if_needed()
        for sel in ("#example", "#speech-status"):
            box = page.locator(sel).bounding_box()
            assert 0 <= box["y"] and box["y"] + box["height"] <= 844, (sel, box)
        # an error shows in the page's flow (it covers nothing) and can be dismissed
        bad = tmp_path / "notes.txt"
        bad.write_text("not audio\n" * 50)
        page.set_input_files("#audio-file", str(bad))
        page.wait_for_selector("#error:not([hidden])", timeout=60_000)
        assert page.evaluate("getComputedStyle(document.getElementById('error')).position") == "static"
        assert "notes.txt is not an audio file" in page.inner_text("#speech-status")
        assert page.is_hidden("#export") and page.is_hidden("#preview")  # nothing of a transcript that is not there
        demo.screenshot(page, "phone_390_error")
        page.get_by_role("button", name="Dismiss the error message").click()
        assert page.is_hidden("#error")
        width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], f"horizontal overflow at 390 px after an error: {width}"
    finally:
        page.close()


def test_the_microphone_is_recorded_through_an_audio_worklet(demo, ui):
    """Chromium's fake microphone (a beep): samples arrive from recorder-worklet.js, resampled to 16 kHz."""
    got = ui.evaluate("""async () => {
        const audio = await import('./audio.js');
        const rec = await audio.startRecording();
        await new Promise((r) => setTimeout(r, 1500));
        const samples = await rec.stop();
        return [samples.length, Math.max(...samples.map(Math.abs))];
    }""")
    assert 8000 <= got[0] <= 16000 * 10 and got[1] > 0.01, got
    assert "createScriptProcessor" not in open(os.path.join(REPO_ROOT, "web", "src", "audio.js")).read()


# ---- model files: browser storage, bad input -------------------------------------
def test_a_reload_takes_model_files_from_browser_storage(demo, dist, ui):
    entry = _model_or_skip(dist, "whisper-tiny.en")
    first = demo.request(ui, "load", model="whisper-tiny.en", timeout_s=300)
    assert first["bytes"] == entry["bytes"]
    demo.goto(ui, WGPU)  # a reload: a fresh worker and Python, the same browser profile
    before = len(demo.server.requests)
    again = demo.request(ui, "load", model="whisper-tiny.en", timeout_s=300)
    fetched = [p for p in demo.server.requests[before:] if p.startswith("/models/whisper-tiny.en/")]
    assert fetched == [], f"model files were downloaded again after the reload: {fetched}"
    assert again["from_cache"] == entry["bytes"]


def test_a_corrupt_model_and_a_non_audio_file_show_errors_and_the_page_recovers(demo, dist, ui, tmp_path):
    gguf = _model_or_skip(dist, "smollm2-135m-instruct")["files"][0]
    with open(_cache_file("smollm2-135m-instruct", gguf["name"]), "rb") as f:
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
def _native_greedy_ids(dist, messages, n, with_prompt=False):
    """tallow on numpy, natively: the reference the browser must reproduce token for token
    (with_prompt: also the prompt's length in tokens)."""
    pytest.importorskip("numpy")
    import tallow
    from tallow.generation import chat
    entry = harness.manifest(dist)["models"]["smollm2-135m-instruct"]
    model = tallow.load_model(_cache_file("smollm2-135m-instruct", entry["files"][0]["name"]), device="cpu")
    stream = chat(model, messages, stream=True, max_tokens=n)
    stream.text()
    return (list(stream.token_ids), stream.prompt_tokens) if with_prompt else list(stream.token_ids)


def _gguf_layout(dist, entry):
    """(bytes of all tensors, bytes of the header) of the demo's GGUF, read natively."""
    import tallow
    with tallow.io.open(_cache_file("smollm2-135m-instruct", entry["files"][0]["name"])) as f:
        return sum(f.info(name).nbytes for name in f.keys()), f.data_start


def test_smollm2_weights_go_from_the_js_buffer_to_the_gpu_without_entering_the_wasm_heap(demo, dist, ui):
    """The fetched GGUF stays a JS ArrayBuffer: Python reads its header prefix, each tensor is copied
    JS -> GPU buffer in JS, and the wasm heap stays far below the file size (the greedy chat test
    below then runs on the model loaded this way)."""
    entry = _model_or_skip(dist, "smollm2-135m-instruct")
    tensor_bytes, header_bytes = _gguf_layout(dist, entry)
    demo.goto(ui, WGPU)  # a fresh worker: the wasm heap only grows, so earlier loads must not count
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
    demo.dismiss_error(ui)  # an earlier test's error (test_a_corrupt_model_...'s bad WAV) may still show
    prompt = "Name three colours of the rainbow."
    ui.fill("#max-tokens", "16")
    ui.fill("#chat-input", prompt)
    demo.record_texts(ui, "#chat-status")
    started = time.perf_counter()
    ui.click("#send")
    ui.wait_for_selector(".assistant[data-done]", timeout=420_000)
    assert not ui.is_visible("#error"), ui.inner_text("#error")
    stats = ui.inner_text("#chat-stats")
    reply = ui.locator(".assistant").last.inner_text()
    result_ids = demo.run(ui, "import tallow_web_worker as w\nw.state['last_chat_ids']")
    print(f"browser chat: {time.perf_counter() - started:.1f} s, {stats}")
    assert len(result_ids) >= 16 and reply.strip()
    native_ids, prompt_tokens = _native_greedy_ids(dist, [{"role": "user", "content": prompt}], 16, with_prompt=True)
    assert result_ids == native_ids
    # decoded by replaying a captured step (tallow.capture): after the prompt, two captured steps
    driver, replays = demo.run(ui, "import tallow\nd = tallow.Device('wgpu').backend.driver\n[d.name, d.replays]")
    assert driver == "browser" and replays >= 16 - 3, (driver, replays)
    # the chat panel's status: the prompt being read, then tokens with the decode rate only
    texts = demo.recorded_texts(ui, "#chat-status")
    assert any(t.startswith(f"Reading your {prompt_tokens}-token prompt") for t in texts), texts
    generating = [t for t in texts if t.startswith("Generating: ")]
    assert generating[0].startswith("Generating: 1 of at most 16 tokens (first token after ")  # no rate from 1 token
    assert "tokens/s" in generating[-1] and texts[-1] == "Done."
    assert f"after a {prompt_tokens}-token prompt" in stats


def test_new_chat_forgets_the_conversation(demo, dist, ui):
    _model_or_skip(dist, "smollm2-135m-instruct")
    assert ui.locator("#chat-log .user").count() >= 1  # the conversation of the test above
    ui.get_by_role("button", name="New chat").click()
    assert ui.locator("#chat-log > *").count() == 0 and ui.inner_text("#chat-stats") == ""
    demo.record_texts(ui, "#chat-status")
    ui.fill("#max-tokens", "1")
    ui.fill("#chat-input", "Hi")
    ui.click("#send")
    ui.wait_for_selector(".assistant[data-done]", timeout=300_000)
    _, prompt_tokens = _native_greedy_ids(dist, [{"role": "user", "content": "Hi"}], 1, with_prompt=True)
    texts = demo.recorded_texts(ui, "#chat-status")
    # only the new message was read (the history is gone), with an estimate from the last reply's rate
    assert any(t.startswith(f"Reading your {prompt_tokens}-token prompt (about ") for t in texts), texts


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
    assert ui.inner_text("#chat-status") == "Stopped."
    assert 1 <= len(ids) < 40, f"{len(ids)} tokens after Stop"


def test_whisper_transcribes_jfk_through_the_file_input(demo, dist, ui):
    """On WebGPU (about a minute on SwiftShader). Without timestamp tokens tiny.en gives the exact
    sentence; with them it drops the comma after "for you", exactly as transformers does."""
    _model_or_skip(dist, "whisper-tiny.en")
    demo.dismiss_error(ui)
    ui.uncheck("#timestamps")
    try:
        _clear_transcript(ui)
        ui.set_input_files("#audio-file", JFK)
        text, error = demo.wait_for_text(ui, "#transcript[data-done]", timeout_s=900)
    finally:
        ui.check("#timestamps")
    assert not error, error
    assert text == JFK_TEXT
    segments = ui.locator("#segments li").all_text_contents()  # folded away: text, not innerText
    stats = ui.inner_text("#speech-stats")
    assert len(segments) == 1 and segments[0].startswith("[0.00 → ")
    assert stats.startswith("11.0 s of audio in ") and " s on WebGPU: " in stats, stats
    assert "as long as the audio lasts." in stats or "quicker than the audio lasts." in stats, stats


def _clear_transcript(page):
    """An earlier test's transcript may still be shown: clear it, so waiting for text waits for this run's."""
    page.evaluate("const t = document.getElementById('transcript'); t.textContent = ''; delete t.dataset.done;")


def _silent_wav(path, seconds=1.0):
    import wave
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))


def test_a_silent_clip_says_no_speech_detected(demo, dist, ui, tmp_path):
    _model_or_skip(dist, "whisper-tiny.en")
    demo.dismiss_error(ui)
    _silent_wav(tmp_path / "silence.wav")
    transcribed_before = ui.evaluate("!!document.getElementById('transcript').dataset.done")
    _clear_transcript(ui)
    demo.record_texts(ui, "#speech-status")
    ui.set_input_files("#audio-file", str(tmp_path / "silence.wav"))
    text, error = demo.wait_for_text(ui, "#transcript[data-done]", timeout_s=600)
    assert not error, error
    assert text.startswith("No speech detected")
    assert ui.inner_text("#speech-status") == "No speech detected in silence.wav."
    assert ui.is_hidden("#export") and ui.is_hidden("#timings") and ui.locator("#segments li").count() == 0
    texts = demo.recorded_texts(ui, "#speech-status")
    if transcribed_before:  # the last run on WebGPU gives the estimate (one 30 s window)
        assert any(t.startswith("Transcribing silence.wav (1 s of audio): about ") and t.endswith(" on WebGPU…")
                   for t in texts), texts


def test_cached_models_are_listed_with_sizes_and_can_be_deleted(demo, dist, ui):
    entry = _model_or_skip(dist, "whisper-tiny.en")
    demo.request(ui, "load", model="whisper-tiny.en", timeout_s=300)  # cached by now, if not before
    ui.evaluate("window.tallowDemo.refreshCache()")
    row = ui.locator('#models tr[data-model="whisper-tiny.en"]')
    assert row.locator(".storage").inner_text() == f"cached ({entry['bytes'] / 1e6:.1f} MB)"
    assert "Browser storage used by this site" in ui.inner_text("#storage")
    ui.get_by_role("button", name="Delete the cached files of Whisper tiny.en (speech to text)", exact=True).click()
    ui.wait_for_function("""document.querySelector('#models tr[data-model="whisper-tiny.en"] .storage')
                            .textContent === 'not downloaded'""", timeout=30_000)
    listed = demo.request(ui, "cache-list")["models"]["whisper-tiny.en"]
    assert listed == {"bytes": 0, "files": 0, "of": len(entry["files"])}
    assert ui.inner_text("#status").startswith(f"Deleted {sum(len(f.get('parts', [f])) for f in entry['files'])} cached files")


# ---- the built folder on a plain static server: the example clip, progress, exports ----------
def test_the_built_folder_is_self_contained_with_big_files_in_parts(dist):
    build = harness.load_web_module("build")
    for root, dirs, files in os.walk(dist):
        for name in dirs + files:
            path = os.path.join(root, name)
            assert not os.path.islink(path), f"{path} is a symlink"
            assert os.path.isdir(path) or os.path.getsize(path) <= build.MAX_FILE_BYTES, path
    for entry in harness.manifest(dist)["models"].values():
        for f in entry["files"]:
            if f["size"] > PART_BYTES:
                assert len(f["parts"]) >= 2 and sum(p["size"] for p in f["parts"]) == f["size"]
                assert all(os.path.getsize(os.path.join(dist, p["url"].split("?")[0])) <= PART_BYTES
                           for p in f["parts"])
    assert not os.path.exists(os.path.join(dist, "models", "whisper-tiny.en", "model.safetensors"))


@pytest.fixture(scope="module")
def example_run(demo, dist):
    """The example clip transcribed (with segment timestamps) in a page from `python -m http.server`:
    a new origin, so the model parts download from that server. (page, speech-status texts, result)."""
    _model_or_skip(dist, "whisper-tiny.en")
    with harness.PlainStaticServer(dist) as server:
        page = demo.open(base_url=server.url)
        try:
            demo.record_texts(page, "#speech-status")
            demo.record_texts(page, "#models tbody")
            page.click("#example")
            text, error = demo.wait_for_text(page, "#transcript[data-done]", timeout_s=900)
            assert not error, error
            result = page.evaluate("JSON.parse(window.tallowDemo.transcriptAs('json'))")
            yield page, demo.recorded_texts(page, "#speech-status"), text, result
        finally:
            demo.screenshot(page, "static_server_example")
            page.close()


def test_a_plain_static_server_runs_the_example_clip_with_progress_and_segments(example_run):
    page, texts, text, result = example_run
    assert text == JFK_TEXT_TIMESTAMPS
    downloads = [t for t in texts if t.startswith("Downloading model.safetensors")]
    assert downloads and "3 parts" in downloads[-1] and " MB of " in downloads[-1], texts
    assert "Transcribing jfk.wav…" in texts and "Loading the speech model…" in texts, texts
    # the first run on this device: an estimate up front only from a CPU speed measured at boot
    # (the automatic choice here: the wasm device, SwiftShader passed over), then progress inside the window
    info = page.evaluate("window.tallowDemo.ready")
    if info["measure_speed"]:
        assert any(t.startswith("Transcribing jfk.wav (11 s of audio): about ") and t.endswith(f" on {_device_name(info)}…")
                   for t in texts), texts
    else:
        assert "Transcribing jfk.wav (11 s of audio)…" in texts, texts
    # (with an estimate, "done" goes on with ", about N s left")
    assert any(t.startswith("Transcribing jfk.wav: 0 of 11 s of audio done") and t.endswith("; listening to the next 11 s…")
               for t in texts), texts
    decoding = [t for t in texts if t.startswith("Transcribing jfk.wav: 0 of 11 s of audio done") and "; writing it down, " in t]
    assert len(decoding) >= 10 and decoding[0].endswith(", 1 word piece so far…"), texts
    assert "Transcribing jfk.wav: 11 of 11 s of audio done." in texts, texts  # the window's progress message
    assert texts[-1] == f"Transcribed jfk.wav: {len(result['segments'])} segment{'s' if len(result['segments']) > 1 else ''}."
    shown = page.locator("#segments li").all_text_contents()  # folded away: text, not innerText
    assert len(shown) == len(result["segments"]) >= 1
    for li, seg in zip(shown, result["segments"]):
        assert li == f"[{seg['start']:.2f} → {seg['end']:.2f}] {seg['text'].strip()}"
    # the transcript shows once: its text; the segments' times stay folded away until asked for
    assert page.is_visible("#transcript") and page.is_visible("#timings") and not page.is_visible("#segments")
    assert page.inner_text("body").count(JFK_TEXT_TIMESTAMPS[:40]) == 1
    assert page.is_visible("#preview") and page.evaluate("document.getElementById('preview').src").startswith("blob:")


def test_the_model_table_follows_the_load_and_agrees_with_the_status_line(demo, example_run):
    """The storage column shows the download as it happens and ends cached; the table's load time
    is the one the status line gave."""
    page, texts, _, _ = example_run
    table = demo.recorded_texts(page, "#models tbody")
    assert any("downloading (" in t for t in table), table
    row = page.locator('#models tr[data-model="whisper-tiny.en"]')
    size = harness.manifest(demo.dist)["models"]["whisper-tiny.en"]["bytes"]
    assert row.locator(".storage").inner_text() == f"cached ({size / 1e6:.1f} MB)"
    import re
    where = _device_name(page.evaluate("window.tallowDemo.ready"))
    said = [m for t in texts if (m := re.match(rf"Whisper tiny\.en \(speech to text\) loaded on {re.escape(where)} in ([\d.]+) s", t))]
    assert said, texts
    assert row.locator(".state").inner_text() == f"loaded on {where} in {said[-1][1]} s"


def test_axe_finds_no_serious_accessibility_violations_after_a_transcription(demo, example_run):
    page = example_run[0]
    page.click("#timings summary")  # the segments' times unfolded too
    assert page.is_visible("#segments")
    assert demo.axe_violations(page) == []


def test_the_transcript_exports_match_tallows_own_writers(example_run):
    """TXT/SRT/VTT/JSON downloaded from the page equal what tallow's TranscriptionResult writes for
    the same segments (the formats of `tallow transcribe`)."""
    from types import SimpleNamespace
    from tallow.models.whisper_transcribe import Segment, TranscriptionResult
    page, _, text, result = example_run
    rated = SimpleNamespace(temperature=0.0, avg_logprob=0.0, compression_ratio=0.0, no_speech_prob=0.0)
    segments = [Segment(i, 0, s["start"], s["end"], s["text"], [], rated) for i, s in enumerate(result["segments"])]
    reference = TranscriptionResult(result["text"], segments, result["language"], result["duration"])
    assert result["text"] == text and result["language"] == "en" and result["duration"] == 11.0
    for fmt in ("txt", "srt", "vtt"):
        with page.expect_download() as download:
            page.get_by_role("button", name=f"Download the transcript as {fmt.upper()} ", exact=False).click()
        with open(download.value.path(), encoding="utf-8") as f:
            got = f.read()
        assert download.value.suggested_filename == f"transcript.{fmt}"
        assert got == reference.format(fmt), (fmt, got)
    with page.expect_download() as download:
        page.get_by_role("button", name="Download the transcript as JSON with segment timestamps").click()
    with open(download.value.path(), encoding="utf-8") as f:
        got = __import__("json").load(f)
    want = reference.to_dict()
    assert got["text"] == want["text"] and got["duration"] == want["duration"]
    assert [{k: s[k] for k in ("id", "start", "end", "text")} for s in want["segments"]] == got["segments"]
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=page.url.split("?")[0].rstrip("/"))
    page.get_by_role("button", name="Copy transcript").click()
    page.wait_for_function("document.getElementById('speech-status').textContent.startsWith('Transcript copied')")
    assert page.evaluate("navigator.clipboard.readText()") == reference.to_txt()


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


# ---- the do-nothing GPU driver in the worker: what bench/gpu_host.py's browser figure times ----
# The same source runs natively and in the page's worker: one-token decode steps of a model on
# wgpu_backend/driver_null.py, eager and then replayed from a capture, with their dispatches.
_NULL_DRIVER_STEPS = r"""
import tallow
from tallow.device import restore_backend, use_backend
from tallow_wgpu.backend import WgpuBackend
from tallow_wgpu.driver_null import NullDriver


def null_driver_steps(folder):
    driver = NullDriver()
    dev = use_backend("wgpu", WgpuBackend(driver))
    try:
        model = tallow.load_model(folder, device=dev)
        steps = {}
        for captured in (False, True):
            model.capture_decode = captured
            cache = model.new_cache()
            model([1, 2, 3], cache=cache, last_only=True).tolist()
            for token in (4, 5):  # a captured cache records its first two steps, then replays
                model([token], cache=cache, last_only=True).tolist()
            driver.reset_counts()
            model([6], cache=cache, last_only=True).tolist()
            steps["captured" if captured else "eager"] = [driver.dispatches, driver.replays, dict(driver.by_kernel)]
        return steps
    finally:
        restore_backend("wgpu")
"""


def test_the_null_driver_in_the_chromium_worker_dispatches_what_it_does_natively(demo, ui, tmp_path):
    """bench/gpu_host.py's browser figure times the same work as its native one: a tiny Llama's
    decode step on the do-nothing driver issues the same dispatches, kernel by kernel, in the page's
    worker as natively, eager and replayed from a capture."""
    pytest.importorskip("transformers")
    import base64
    from tiny_llama import save_tiny_llama
    save_tiny_llama(tmp_path, ["hello world, the quick brown fox"] * 8)
    namespace = {}
    exec(_NULL_DRIVER_STEPS, namespace)
    native = namespace["null_driver_steps"](str(tmp_path))
    files = {p.name: base64.b64encode(p.read_bytes()).decode() for p in tmp_path.iterdir() if p.is_file()}
    got = demo.run(ui, _NULL_DRIVER_STEPS + f"""
import base64, os
os.makedirs("/tmp/tiny-llama", exist_ok=True)
for name, data in {files!r}.items():
    with open("/tmp/tiny-llama/" + name, "wb") as f:
        f.write(base64.b64decode(data))
null_driver_steps("/tmp/tiny-llama")
""")
    assert native["eager"][0] > 0 and native["eager"][1] == 0, native
    assert native["captured"][1] == 1, f"the captured step was not replayed natively: {native}"
    print(f"one tiny-Llama decode step on the null driver: {native}")
    assert got == native
    # the page's own WebGPU device is back after the test
    assert demo.run(ui, "import tallow\ntallow.Device('wgpu').backend.driver.name") == "browser"
