"""The conformance op cases (tests/conformance/cases.py) in headless Chromium with WebGPU disabled,
on the page's wasm device: PageWasmBackend over BrowserWasmDriver (kernels.wasm in V8), chosen by
the page's own boot. Each case's result is checked on the host against its numpy/torch reference,
as tests/conformance/test_cases.py does natively; a case that meets an op the device lacks is a skip
only when its UnsupportedError is one of tests/conformance/wasm_limits.py's listed limits, and the
page refuses exactly the cases the native wasm device (wasmtime) refuses. All cases run in one
request to one page (a few seconds), so the module costs one site build and one boot."""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.browser

_spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness_wasm_conformance",
                                               os.path.join(HERE, "browser", "harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
if os.path.join(HERE, "conformance") not in sys.path:  # cases.py and compare.py import each other by name
    sys.path.insert(0, os.path.join(HERE, "conformance"))
import cases  # noqa: E402  (shipped as it is into the page's Pyodide)
from compare import assert_matches  # noqa: E402
from wasm_limits import wasm_limit  # noqa: E402

# Run in the page after cases.py's text: every case on the wasm device, its result, its
# UnsupportedError, or any other error's traceback; and what the device is made of.
BATCH = '''
import traceback as _traceback
import tallow as _tallow
_results = {}
for _name in sorted(CASES):
    try:
        _results[_name] = {"out": run(_name, "wasm")}
    except _tallow.UnsupportedError as _e:
        _results[_name] = {"refused": str(_e)}
    except Exception:
        _results[_name] = {"error": _traceback.format_exc()}
_backend = _tallow.Device("wasm").backend
{"cases": _results, "backend": type(_backend).__name__, "driver": _backend.driver.name}
'''


@pytest.fixture(scope="module")
def page_results(tmp_path_factory):
    harness.require_browser()
    out = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(out, models=False)
    with harness.DemoBrowser(out) as demo:
        # --disable-webgpu without --enable-unsafe-webgpu: navigator.gpu is there, its adapter null
        with demo.other_browser(["--disable-webgpu"], without=["--enable-unsafe-webgpu"]) as browser:
            page = browser.new_page()
            demo.watch(page)
            demo.goto(page)
            info = page.evaluate("window.tallowDemo.ready")
            with open(cases.__file__, encoding="utf-8") as f:
                got = demo.run(page, f.read() + BATCH, timeout_s=300)
            errors = demo.errors()
    return info, got, errors


def test_the_page_chose_the_wasm_device_on_its_browser_driver(page_results):
    info, got, errors = page_results
    assert info["device"] == "wasm" and "gpu" not in info and info["wasm_error"] is None, info
    assert info["gpu_error"].startswith("no WebGPU adapter"), info
    assert (got["backend"], got["driver"]) == ("PageWasmBackend", "browser")
    assert not errors, errors


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_case_on_the_pages_wasm_device_matches_reference(page_results, name):
    np = pytest.importorskip("numpy")
    case = cases.CASES[name]
    result = page_results[1]["cases"][name]
    assert "error" not in result, f"{name} on the page's wasm device:\n{result.get('error')}"
    if "refused" in result:
        reason = wasm_limit(result["refused"])
        assert reason is not None, f"{name}: an UnsupportedError that wasm_limits.py does not list: {result['refused']}"
        pytest.skip(f"wasm: {reason} ({result['refused']})")
    if case.torch:
        pytest.importorskip("torch")
    assert_matches(result["out"], case.reference(np), f"{name} on the page's wasm device", *case.tolerance("wasm"))


def test_the_page_refuses_what_the_native_wasm_device_refuses(page_results):
    """The same kernel table in V8 and in wasmtime: the same cases run, the same are refused."""
    import tallow
    try:
        tallow.Device("wasm")
    except tallow.errors.DeviceError as e:
        pytest.skip(f"no native wasm device here: {e}")
    native = {name: cases.refusal(name, "wasm") for name in cases.CASES}
    page = {name: r.get("refused") for name, r in page_results[1]["cases"].items()}
    assert page == native
