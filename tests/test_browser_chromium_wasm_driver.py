"""The "wasm-chromium" conformance device's driver (tests/browser/chromium_wasm_driver.py): its
kernels really run in headless Chromium's V8 with WebGPU disabled, its batched round trips give the
results numpy gives, a trap in a queued call is a clear error naming the export, and its mirrored
bump allocator agrees with driver.js's. The conformance suite itself runs on the device through
tests/conftest.py (every test in tests/conformance/ that runs on "wasm")."""
import struct

import numpy as np
import pytest

import tallow
from tallow.device import restore_backend, use_backend
from tallow.errors import DeviceError

pytestmark = pytest.mark.browser


@pytest.fixture
def chromium_wasm(chromium_wasm_backend):
    dev = use_backend("wasm", chromium_wasm_backend)
    try:
        yield dev, chromium_wasm_backend.driver
    finally:
        restore_backend("wasm")


def test_the_kernels_run_in_chromium_without_webgpu(chromium_wasm):
    _, driver = chromium_wasm
    assert driver.name == "chromium" and "HeadlessChrome" in driver.user_agent
    page = driver.chromium
    assert page.evaluate("async () => navigator.gpu ? await navigator.gpu.requestAdapter() : null") is None
    assert page.evaluate("() => typeof window.__tallowWasm[0].call") == "function"


def test_a_computation_is_one_round_trip_and_matches_numpy(chromium_wasm):
    dev, driver = chromium_wasm
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 40)).astype(np.float32)
    b = rng.standard_normal((40, 9)).astype(np.float32)
    x, w = tallow.tensor(a, device=dev), tallow.tensor(b, device=dev)
    before = driver.chromium.round_trips
    y = ((x @ w) * 0.5).exp().sum(-1)  # uploads, allocations and calls are queued...
    assert driver.chromium.round_trips == before
    got = y.numpy()  # ...and sent with the read, in one page.evaluate
    assert driver.chromium.round_trips == before + 1
    np.testing.assert_allclose(got, np.exp((a @ b) * 0.5).sum(-1), rtol=2e-5)


def test_a_trap_in_a_queued_call_names_the_export_and_the_driver_goes_on(chromium_wasm):
    _, driver = chromium_wasm
    table = driver.upload(np.arange(8, dtype=np.float32).tobytes(), None)
    ids = driver.upload(struct.pack("<i", 99), None)  # outside the 4-row table: rows_f32 traps
    out = driver.alloc_bytes(8)
    driver.launch("rows_f32", [table, 4, 2, ids, 1, out])
    with pytest.raises(DeviceError, match=r"kernels.wasm in Chromium: the call of rows_f32.*unreachable"):
        driver.download(out, 0, 8)
    driver.write(ids, 0, struct.pack("<i", 3))
    driver.launch("rows_f32", [table, 4, 2, ids, 1, out])
    assert struct.unpack("<2f", driver.download(out, 0, 8)) == (6.0, 7.0)


def test_the_mirrored_allocator_agrees_with_driver_js(chromium_wasm):
    _, driver = chromium_wasm
    before = driver.memory_bytes()
    sizes = (1, 17, before + 1, 5, 1 << 16)  # more than the whole memory: it grows
    bufs = [driver.alloc_bytes(n) for n in sizes]
    assert all(b.at % 16 == 0 for b in bufs)
    assert driver.memory_bytes() >= max(b.at + b.nbytes for b in bufs) and driver.memory_bytes() > before
    data = bytes(range(256)) * 5
    driver.write(bufs[2], sizes[2] - len(data), data)
    assert driver.download(bufs[2], sizes[2] - len(data), len(data)) == data
    assert driver.download(bufs[4], 0, 1 << 16) == bytes(1 << 16)  # fresh memory is zero
