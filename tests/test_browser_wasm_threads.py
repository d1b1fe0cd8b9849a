"""The wasm device on threads in the page (issue 31 item 4, docs/wasm.md "Threads"): in a Chromium
without WebGPU, the page served by `tallow web serve` is cross-origin isolated (COOP/COEP), so with
?threads=2 the wasm device runs kernels_mt.wasm on 2 threads over one shared memory (the page's
worker and one more worker, the recorded programs cut by tallow.backends.wasm.threads), and
SmolLM2-135M Q4_1's greedy chat gives the token ids tallow gives natively on the CPU device, and
Whisper tiny.en the exact jfk sentence (its encoder's GEMMs shared). On a plain static host with the
service worker off (?isolate=0: not isolated) ?threads=2 gets one thread (kernels.wasm, an unshared
memory), said in threads_note, and the same ids. Needs what tests/test_browser_wasm_page.py needs."""
import importlib.util
import os
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = [pytest.mark.browser, pytest.mark.models]
MODEL = "smollm2-135m-instruct"
PROMPT = "Name three colours of the rainbow."
JFK = os.path.join(HERE, "data", "jfk.wav")
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
THREADS = ("import tallow\nd = tallow.Device('wasm').backend.driver\n"
           "[d.threads, d.threads_note, getattr(d, 'threaded_runs', 0), bool(d._js.shared)]")
NOGPU = (["--disable-webgpu"], ["--enable-unsafe-webgpu"])


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
    with harness.DemoBrowser(dist) as d:
        yield d


@pytest.fixture(scope="module")
def native_ids(demo):
    pytest.importorskip("numpy")
    import tallow
    from tallow.generation import chat
    entry = harness.manifest(demo.dist)["models"][MODEL]
    path = os.path.join(harness.load_web_module("build")._tallow_home(), MODEL, entry["files"][0]["name"])
    stream = chat(tallow.load_model(path, device="cpu"), [{"role": "user", "content": PROMPT}], stream=True,
                  max_tokens=16)
    stream.text()
    return list(stream.token_ids)


def _chat(demo, page, n):
    demo.request(page, "load", model=MODEL, timeout_s=300)
    page.fill("#max-tokens", str(n))
    page.fill("#chat-input", PROMPT)
    started = time.perf_counter()
    page.click("#send")
    page.wait_for_selector(".assistant[data-done]", timeout=300_000)
    assert not page.is_visible("#error"), page.inner_text("#error")
    ids = demo.run(page, "import tallow_web_worker as w\nw.state['last_chat_ids']")
    return ids, time.perf_counter() - started, page.inner_text("#chat-stats")


def test_an_isolated_page_chats_and_transcribes_on_two_threads(demo, native_ids):
    with demo.other_browser(*NOGPU) as browser:
        page = browser.new_page()
        demo.watch(page)
        seen = len(demo.console)
        demo.goto(page, "?threads=2")
        assert page.evaluate("crossOriginIsolated") is True
        assert page.evaluate("window.tallowDemo.ready")["device"] == "wasm"
        assert demo.run(page, THREADS)[:2] == [2, None]
        ids, seconds, stats = _chat(demo, page, 16)
        threads, note, runs, shared = demo.run(page, THREADS)
        replays = demo.run(page, "import tallow\ntallow.Device('wasm').backend.replays")
        print(f"page chat on wasm, {threads} threads: {seconds:.1f} s, {stats}; {replays} replays, {runs} threaded runs")
        assert ids == native_ids
        assert (threads, note, shared) == (2, None, True)
        assert replays >= 16 - 3 and runs >= replays  # every replayed step ran on both threads
        if harness.manifest(demo.dist)["models"]["whisper-tiny.en"]["missing"]:
            return
        page.uncheck("#timestamps")
        started = time.perf_counter()
        page.set_input_files("#audio-file", JFK)
        text, error = demo.wait_for_text(page, "#transcript[data-done]", timeout_s=600)
        print(f"page jfk on wasm, 2 threads: {time.perf_counter() - started:.1f} s, {page.inner_text('#speech-stats')}")
        assert not error, error
        assert text == JFK_TEXT
        errors = [e for e in demo.errors() if e in demo.console[seen:]]
        assert not errors, errors


def test_a_page_that_is_not_isolated_chats_on_one_thread(demo, native_ids):
    with harness.PlainStaticServer(demo.dist) as plain, demo.other_browser(*NOGPU) as browser:
        page = browser.new_page()
        demo.watch(page)
        seen = len(demo.console)
        demo.goto(page, "?isolate=0&threads=2", base_url=plain.url)
        assert page.evaluate("crossOriginIsolated") is False
        assert page.evaluate("window.tallowDemo.ready")["device"] == "wasm"
        threads, note, runs, shared = demo.run(page, THREADS)
        assert (threads, runs, shared) == (1, 0, False) and "not cross-origin isolated" in note, note
        ids, seconds, stats = _chat(demo, page, 8)
        print(f"page chat on wasm, 1 thread (not isolated): {seconds:.1f} s, {stats}")
        assert ids == native_ids[:len(ids)] and len(ids) == 8
        assert demo.run(page, THREADS)[2] == 0
        errors = [e for e in demo.errors() if e in demo.console[seen:]]
        assert not errors, errors
