"""tallow.mjs, the OpenAI-shaped JavaScript API of the built site, driven from a page that is not
the demo: a page of its own in a subfolder of the site imports ../tallow.mjs (so the worker and
the site's files are found from the module's URL, not the page's), runs a greedy chat (plain and
streamed, two requests in flight at once), the errors OpenAI names, and a transcription of jfk.wav.

Needs what tests/test_browser.py needs (Chromium, web/node_modules, playwright, the cached models);
skips with the reason otherwise (TALLOW_REQUIRE_BROWSER=1 makes that a failure). One page load,
8 new tokens, on the device a developer's page gets by default: here, where Chromium's WebGPU is
SwiftShader (a software adapter), the wasm device.
"""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
PROMPT = "Name three colours of the rainbow."
MAX_TOKENS = 8

pytestmark = pytest.mark.browser

_spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

# The developer's page: everything it does goes through the module's exports; it writes a JSON report.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>my page</title><link rel="icon" href="data:,"></head>
<body><pre id="out"></pre>
<script type="module">
import { createClient, APIError } from "../tallow.mjs";
const messages = [{ role: "user", content: PROMPT }];
const errorOf = async (promise) => {
  try { await promise; return null; } catch (e) {
    return { name: e.name, isApiError: e instanceof APIError, status: e.status, code: e.code, message: e.message };
  }
};
async function run() {
  let progress = 0;
  const client = await createClient({ onProgress: () => (progress += 1) });
  const models = await client.models.list();
  const body = { model: "smollm2-135m-instruct", messages, max_tokens: MAX_TOKENS, temperature: 0 };
  // both in flight at once: the worker runs them in turn, each stream gets its own tokens
  const [plain, stream] = await Promise.all([client.chat.completions.create(body),
                                             client.chat.completions.create({ ...body, stream: true })]);
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const unknownModel = await errorOf(client.chat.completions.create({ ...body, model: "no-such-model" }));
  const overflow = await errorOf(client.chat.completions.create({ ...body, max_tokens: 1000000 }));
  const clip = await (await fetch("../examples/jfk.wav")).blob();
  const transcript = await client.audio.transcriptions.create({ file: clip, model: "whisper-tiny.en" });
  return { progress, device: client.info.device, gpuOnCpu: !client.info.gpu || client.info.gpu.cpu_emulated, models, plain, chunks, unknownModel, overflow,
           transcript: { text: transcript.text, keys: Object.keys(transcript) } };
}
run().then((r) => (window.apiReport = r), (e) => (window.apiReport = { failed: String(e && e.stack || e) }))
  .finally(() => (document.getElementById("out").textContent = JSON.stringify(window.apiReport)));
</script></body></html>
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    harness.require_browser()
    out = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(out)
    entries = harness.manifest(out)["models"]
    for name in ("smollm2-135m-instruct", "whisper-tiny.en"):
        if entries[name]["missing"]:
            harness.require_browser(f"{name}: {entries[name]['missing']}")
    return out


def _native_greedy(dist):
    """tallow on numpy, natively: the reply the page must reproduce (text and token count)."""
    pytest.importorskip("numpy")
    import tallow
    from tallow.generation import chat
    entry = harness.manifest(dist)["models"]["smollm2-135m-instruct"]
    home = harness.load_web_module("build")._tallow_home()
    model = tallow.load_model(os.path.join(home, "smollm2-135m-instruct", entry["files"][0]["name"]), device="cpu")
    stream = chat(model, [{"role": "user", "content": PROMPT}], stream=True, max_tokens=MAX_TOKENS)
    text = stream.text()
    return text, list(stream.token_ids), stream.prompt_tokens, stream.finish_reason


def test_a_page_of_its_own_imports_tallow_mjs_and_gets_openai_shaped_answers(dist):
    os.makedirs(os.path.join(dist, "mypage"))
    page_html = PAGE.replace("PROMPT", json.dumps(PROMPT)).replace("MAX_TOKENS", str(MAX_TOKENS))
    with open(os.path.join(dist, "mypage", "index.html"), "w") as f:
        f.write(page_html)
    with harness.DemoBrowser(dist) as browser:
        page = browser.context.new_page()
        browser.watch(page)
        page.goto(browser.server.url + "mypage/index.html")
        page.wait_for_function("window.apiReport !== undefined", timeout=900_000)  # a hang guard only
        report = page.evaluate("window.apiReport")
        errors = browser.errors()
    assert "failed" not in report, report.get("failed")
    assert not errors, errors
    assert report["progress"] > 0  # boot and model loads reported through onProgress

    ids = {m["id"]: m for m in report["models"]["data"]}
    assert report["models"]["object"] == "list"
    assert ids["smollm2-135m-instruct"]["kind"] == "llm" and ids["whisper-tiny.en"]["kind"] == "whisper"
    assert all(m["object"] == "model" for m in ids.values())

    text, token_ids, prompt_tokens, finish = _native_greedy(dist)
    plain = report["plain"]
    assert plain["object"] == "chat.completion" and plain["id"].startswith("chatcmpl-")
    assert plain["model"] == "smollm2-135m-instruct" and isinstance(plain["created"], int)
    choice = plain["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    # greedy on the page's default device (the wasm device here) gives native tallow's tokens, so its text too
    assert report["device"] == ("wasm" if report["gpuOnCpu"] else "wgpu"), report["device"]
    assert plain["tallow"]["token_ids"] == token_ids, (plain["tallow"]["token_ids"], token_ids)
    assert choice["message"]["content"] == text
    assert choice["finish_reason"] == finish == "length"
    assert plain["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": MAX_TOKENS,
                              "total_tokens": prompt_tokens + MAX_TOKENS}

    chunks = report["chunks"]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(deltas) == text and 3 <= len(chunks) <= 2 + MAX_TOKENS  # role, a chunk a token, the finish
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chunks[-1]["usage"] == plain["usage"] and chunks[-1]["choices"][0]["delta"] == {}

    unknown = report["unknownModel"]
    assert unknown["isApiError"] and unknown["status"] == 404 and unknown["code"] == "model_not_found"
    assert "no-such-model" in unknown["message"] and "smollm2-135m-instruct" in unknown["message"]
    overflow = report["overflow"]
    assert overflow["isApiError"] and overflow["status"] == 400 and overflow["code"] == "context_length_exceeded"
    assert "context window" in overflow["message"], overflow["message"]

    assert report["transcript"]["text"] == JFK_TEXT
    assert report["transcript"]["keys"] == ["text", "tallow"]
