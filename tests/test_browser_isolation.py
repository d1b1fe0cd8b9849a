"""Cross-origin isolation of the demo page (issue 31 item 4: the wasm device's threads need
SharedArrayBuffer): `tallow web serve` sends COOP/COEP, so the page and its worker are isolated
with no service worker; a plain static host (`python -m http.server`, no such headers) gets the
same through web/src/isolate.js, which registers itself as a service worker and reloads the page
once; ?isolate=0 leaves a plain host's page as it is. Needs what tests/test_browser.py needs."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = [pytest.mark.browser]


def _harness():
    spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _harness()
STATE = """async () => ({isolated: crossOriginIsolated, shared: typeof SharedArrayBuffer === "function",
    controlled: !!navigator.serviceWorker.controller,
    registrations: (await navigator.serviceWorker.getRegistrations()).length})"""
WORKER_ISOLATED = "import js\n[bool(js.crossOriginIsolated), str(js.SharedArrayBuffer.name)]"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    harness.require_browser()
    dist = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(dist, models=False)
    with harness.DemoBrowser(dist) as d:
        yield d


def test_the_served_page_and_its_worker_are_cross_origin_isolated(demo):
    page = demo.open()
    state = page.evaluate(STATE)
    assert state == {"isolated": True, "shared": True, "controlled": False, "registrations": 0}, state
    assert demo.run(page, WORKER_ISOLATED) == [True, "SharedArrayBuffer"]
    assert not demo.errors(), demo.errors()


def test_a_static_host_without_headers_is_isolated_by_the_service_worker(demo):
    with harness.PlainStaticServer(demo.dist) as plain, \
            demo.other_browser([]) as browser:  # its own profile: no service worker from another test
        page = browser.new_page()
        demo.watch(page)
        # without the service worker (?isolate=0) the plain host's page is not isolated
        demo.goto(page, "?isolate=0", base_url=plain.url)
        state = page.evaluate(STATE)
        assert state == {"isolated": False, "shared": False, "controlled": False, "registrations": 0}, state
        assert demo.run(page, "import js\nbool(js.crossOriginIsolated)") is False
        # the page registers isolate.js, reloads once under it, and boots isolated
        demo.goto(page, "", base_url=plain.url)
        page.wait_for_function("crossOriginIsolated", timeout=60_000)
        page.wait_for_selector("body[data-ready]", timeout=90_000)
        state = page.evaluate(STATE)
        assert state == {"isolated": True, "shared": True, "controlled": True, "registrations": 1}, state
        assert demo.run(page, WORKER_ISOLATED) == [True, "SharedArrayBuffer"]
        assert page.evaluate('performance.getEntriesByType("navigation")[0].type') == "reload"
        # a later visit is isolated from its first load, without another reload
        demo.goto(page, "", base_url=plain.url)
        assert page.evaluate('[crossOriginIsolated, performance.getEntriesByType("navigation")[0].type]') == \
            [True, "navigate"]
    assert not demo.errors(), demo.errors()
