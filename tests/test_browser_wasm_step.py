"""kernels.wasm in Chromium (V8's SIMD128 code, not wasmtime's): SmolLM2-135M-Instruct Q4_1's
recorded decode step run from JS, one `run` call a token, gives the greedy ids wasmtime gives on
the same memory image (bench/wasm_step_chromium.py; wasmtime's ids equal the CPU device's,
tests/test_wasm_smollm2.py). Not yet the page's device: the image is made natively."""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = [pytest.mark.browser, pytest.mark.models]


def _harness():
    spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chromium_runs_the_recorded_smollm2_step_to_wasmtimes_ids():
    _harness().require_browser()
    pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
    pytest.importorskip("wasmtime", reason="the reference run needs wasmtime (the dev extra)")
    from tallow.backends.wasm import build
    if build.linker() is None:
        pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang")
    spec = importlib.util.spec_from_file_location("bench_wasm_step_chromium",
                                                  os.path.join(os.path.dirname(HERE), "bench", "wasm_step_chromium.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    try:
        r = bench.measure(8)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert r["chromium_ids"] == r["native_ids"] and len(r["native_ids"]) == 9
    assert r["chromium_tok_s"] > 0
