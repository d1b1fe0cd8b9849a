"""Drive the web demo (web/dist) in headless Chromium with Playwright's sync API.

    with DemoBrowser(dist) as demo:
        page = demo.open()                      # boots Pyodide in the page's worker
        demo.request(page, "run", code="1 + 1")  # -> 2

Chromium is launched the way ENVIRONMENT.md found to work: Debian's
/usr/bin/chromium, --enable-unsafe-webgpu (SwiftShader), and a persistent
context in a fresh profile folder (Playwright refuses --user-data-dir), which
also keeps the Cache API between page loads.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
WEB = os.path.join(REPO_ROOT, "web")
CHROMIUM = os.environ.get("TALLOW_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--enable-unsafe-webgpu",
                 # a fake microphone (a beep) without a permission prompt, and audio that starts unprompted
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 "--autoplay-policy=no-user-gesture-required"]
AXE = os.path.join(WEB, "node_modules", "axe-core", "axe.min.js")
# Messages Chromium itself prints for a headless, GPU-less machine; they are not page errors.
BENIGN_CONSOLE = ("Failed to create WebGPU Context Provider",)


def missing_requirements():
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set $TALLOW_CHROMIUM)"
    if not os.path.exists(os.path.join(WEB, "node_modules", "pyodide", "pyodide.mjs")):
        return f"no Pyodide npm package in {WEB}/node_modules (run `npm ci` in web/)"
    if not os.path.exists(AXE):
        return f"no axe-core in {WEB}/node_modules (run `npm ci` in web/)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install playwright; never `playwright install`)"
    return None


def require_browser(missing=None):
    """Skip the calling test (or fixture) when the browser tests cannot run here (or for the
    reason given); with TALLOW_REQUIRE_BROWSER=1 (CI) that is a failure instead."""
    import pytest
    missing = missing or missing_requirements()
    if missing and os.environ.get("TALLOW_REQUIRE_BROWSER") == "1":
        pytest.fail(f"TALLOW_REQUIRE_BROWSER=1 but {missing}")
    if missing:
        pytest.skip(missing)


def load_web_module(name):
    import importlib.util
    key = f"tallow_web_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(WEB, f"{name}.py"))
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


def build_test_site(out, models=True, part_bytes=None):
    """Build the demo into `out` as the browser tests and benches drive it: with the test hooks
    (the worker's `run` request evaluates Python) and, with models=True, the cached models."""
    return load_web_module("build").build(out, models=models, quiet=True, part_bytes=part_bytes, test_hooks=True)


class PlainStaticServer:
    """`python3 -m http.server` in a subprocess: what any static host does, with nothing of tallow's
    server (no byte ranges, no request log). Same start/close/url as StaticServer."""

    def __init__(self, dist):
        self.dist = dist
        self.process = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"

    def start(self, timeout_s=20):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1", "--directory", self.dist],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(self.url + "site.json", timeout=2).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"python -m http.server did not start on port {self.port}") from None
                time.sleep(0.1)

    def close(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


class DemoBrowser:
    def __init__(self, dist, artifacts=None):
        self.dist = dist
        self.artifacts = artifacts
        self.server = load_web_module("serve").StaticServer(dist)
        self.console = []  # (type, text) of every console message and page error, all pages
        self._playwright = self.context = None
        self._profile = None

    def __enter__(self):
        from playwright.sync_api import sync_playwright
        self.server.start()
        self._profile = tempfile.mkdtemp(prefix="tallow-chromium-")
        self._playwright = sync_playwright().start()
        self.context = self._playwright.chromium.launch_persistent_context(
            self._profile, headless=True, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        return self

    def __exit__(self, *exc):
        try:
            if self.context is not None:
                self.context.close()
        finally:
            if self._playwright is not None:
                self._playwright.stop()
            self.server.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    @contextlib.contextmanager
    def other_browser(self, extra_args, without=()):
        """A second Chromium (own profile) on the same server, with more flags and without some of
        CHROMIUM_ARGS (a browser without navigator.gpu: --disable-webgpu, without
        --enable-unsafe-webgpu, which would win); its pages work with goto/run/request."""
        profile = tempfile.mkdtemp(prefix="tallow-chromium-")
        args = [a for a in CHROMIUM_ARGS if a not in without] + list(extra_args)
        context = self._playwright.chromium.launch_persistent_context(
            profile, headless=True, executable_path=CHROMIUM, args=args)
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)

    def open(self, query="", timeout_s=90, base_url=None, viewport=None):
        """A new page on the demo (base_url: another server of the same folder), booted."""
        page = self.context.new_page()
        if viewport:
            page.set_viewport_size(viewport)
        self.watch(page)
        self.goto(page, query, timeout_s, base_url)
        return page

    def watch(self, page):
        page.on("console", lambda m: self.console.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.console.append(("pageerror", str(e))))

    def goto(self, page, query="", timeout_s=90, base_url=None):
        page.goto((base_url or self.server.url) + query)
        page.wait_for_selector("body[data-ready]", timeout=timeout_s * 1000)

    def errors(self):
        return [(t, m) for t, m in self.console
                if t in ("error", "pageerror") and not any(b in m for b in BENIGN_CONSOLE)]

    def request(self, page, type_, timeout_s=120, **fields):
        """A worker request through the page's tallowDemo.request; a worker error raises playwright's Error."""
        return page.evaluate(
            """async ([type, fields, ms]) => {
                const timeout = new Promise((_, reject) => setTimeout(
                    () => reject(new Error(`no answer to ${type} within ${ms / 1000} s`)), ms));
                return await Promise.race([window.tallowDemo.request(type, fields), timeout]);
            }""", [type_, fields, timeout_s * 1000])

    def run(self, page, code, timeout_s=120):
        """Evaluate Python in the page's worker; the value of the last expression (NaN/Infinity kept)."""
        return json.loads(self.request(page, "run", timeout_s, code=code))

    def copy_model_files(self, page, model, folder="/models", timeout_s=300):
        """Fetch a model of the site's manifest into the worker's file system, under folder/model
        (parts joined); returns that folder's path in the worker. Needs a test build."""
        code = f"import tallow_web_test_hooks as hooks\nawait hooks.copy_model_files({model!r}, {folder!r})"
        return self.run(page, code, timeout_s)

    def screenshot(self, page, name):
        if self.artifacts:
            os.makedirs(self.artifacts, exist_ok=True)
            page.screenshot(path=os.path.join(self.artifacts, f"{name}.png"), full_page=True)

    def wait_for_text(self, page, selector, timeout_s):
        """Wait until `selector` exists with text or the error box shows; returns (text, error text)."""
        page.wait_for_function(
            """(sel) => (document.querySelector(sel) && document.querySelector(sel).textContent.trim()) ||
                        !document.getElementById('error').hidden""", arg=selector, timeout=timeout_s * 1000)
        error = page.inner_text("#error") if page.is_visible("#error") else ""
        text = page.evaluate("(sel) => document.querySelector(sel) ? document.querySelector(sel).innerText : ''", selector)
        return text.strip(), error

    @staticmethod
    def axe_violations(page, impacts=("serious", "critical")):
        """axe-core's accessibility rules on the page as it is now (web/node_modules/axe-core, a dev
        dependency): [(rule id, impact, help, [selectors])] of the violations of these impacts."""
        page.add_script_tag(path=AXE)
        found = page.evaluate("""async () => (await axe.run(document)).violations.map(
            (v) => [v.id, v.impact, v.help, v.nodes.map((n) => n.target.join(' '))])""")
        return [tuple(v) for v in found if v[1] in impacts]

    def dismiss_error(self, page):
        page.evaluate("document.getElementById('error').hidden = true")

    @staticmethod
    def record_texts(page, selector):
        """Start keeping every text `selector` shows (a status line); read them with recorded_texts."""
        page.evaluate("""(sel) => {
            const el = document.querySelector(sel);
            window.__texts = window.__texts || {};
            const log = window.__texts[sel] = [el.textContent];
            new MutationObserver(() => { if (log[log.length - 1] !== el.textContent) log.push(el.textContent); })
                .observe(el, {childList: true, characterData: true, subtree: true});
        }""", selector)

    @staticmethod
    def recorded_texts(page, selector):
        return page.evaluate("(sel) => window.__texts[sel]", selector)


def manifest(dist):
    with open(os.path.join(dist, "models", "manifest.json")) as f:
        return json.load(f)
