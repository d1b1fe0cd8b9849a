"""Shared fixtures: the devices every op test runs on, and the test data (models, audio).

`device` runs a test body once per device: cpu (numpy), python (pure Python), wgpu (lavapipe
on CI), the real cuda and metal devices where present, and the CUDA and Metal kernels on
their CPU emulators (tallow_cuda.cpu_driver, tallow_metal.cpu_driver), bound to the names
"cuda" and "metal" through the public tallow.device.use_backend for the test's duration.
An absent device is a skip with the reason.
"""
import os
import shutil
import sys
from pathlib import Path

import pytest

import tallow
from tallow import device as device_module

DATA = Path(__file__).parent / "data"

# test id -> (device name the tensors carry, "module:Class" of the emulator backend, or None for the real device)
DEVICES = {
    "cpu": ("cpu", None),
    "python": ("python", None),
    "wgpu": ("wgpu", None),
    "cuda": ("cuda", None),
    "metal": ("metal", None),
    "cuda-emulator": ("cuda", "tallow_cuda.cpu_driver:CudaCpuEmulatorBackend"),
    "metal-emulator": ("metal", "tallow_metal.cpu_driver:MetalCpuEmulatorBackend"),
    "wasm": ("wasm", None),
    "wasm-chromium": ("wasm", "chromium"),
}
# The wasm device runs the conformance suite only, which pytest_generate_tests adds it to: "wasm" is
# kernels.wasm under wasmtime, "wasm-chromium" the same WasmBackend with its kernels in headless
# Chromium's V8 (tests/browser/chromium_wasm_driver.py; marked `browser`). What neither can run is
# listed in conformance/wasm_limits.py.
WASM_DEVICES = ("wasm", "wasm-chromium")
ALL_DEVICES = tuple(d for d in DEVICES if d not in WASM_DEVICES)


def pytest_generate_tests(metafunc):
    """`device` runs a test once per device of ALL_DEVICES, and in tests/conformance/ also on the
    wasm device, natively and in Chromium (whose listed limits skip there: conformance/wasm_limits.py). A test that
    parametrizes "device" itself keeps its own list."""
    if "device" not in metafunc.fixturenames:
        return
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get("device")
    if defs and defs[-1].params:
        return  # a module's own `device` fixture with its own params (test_custom_op.py)
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0]
        if "device" in [n.strip() for n in names]:
            return
    conformance = metafunc.definition.path.parent.name == "conformance"
    metafunc.parametrize("device", ALL_DEVICES + (WASM_DEVICES if conformance else ()), indirect=True)

# Real checkpoints (Whisper tiny.en, SmolLM2-135M) take many minutes per call on these devices
# (measured: over 5 min for jfk.wav on each emulator): tests that need one take `model_device`,
# which skips them here; the same model code runs on them with random-weight tiny models.
SLOW_DEVICES = {
    "python": "pure Python",
    "cuda-emulator": "the CUDA kernels on the CPU emulator",
    "metal-emulator": "the MSL kernels on the CPU emulator",
}

# What the emulated devices cannot run yet, each with the reason (a test id prefix -> reason).
EMULATOR_LIMITS = {
    "tests/test_custom_op.py::": "the CUDA and Metal backends ignore CustomOp's cuda/msl sources (issue 12 item 3)",
    "tests/test_autograd.py::test_finite_differences_f64[metal-emulator]": "Metal has no f64",
    "tests/test_training.py::test_training_step_matches_across_devices": "15-30 s per emulator: the training step's ops "
                                                                         "and gradients run there in test_autograd.py",
}

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """On the wasm devices, an UnsupportedError that is one of its listed limits is a skip with the
    listed reason; any other error fails."""
    try:
        return (yield)
    except tallow.UnsupportedError as e:
        callspec = getattr(item, "callspec", None)
        test_id = callspec.params.get("device") if callspec is not None else None
        if test_id not in WASM_DEVICES:
            raise
        sys.path.insert(0, str(Path(__file__).parent / "conformance"))
        from wasm_limits import wasm_limit
        reason = wasm_limit(str(e))
        if reason is None:
            raise
        pytest.skip(f"{test_id}: {reason} ({e})")


_emulators = {}  # test id -> the emulator backend (its kernels compile once per session) or the skip reason


def _probe(name):
    try:
        tallow.Device(name)
        return None
    except tallow.DeviceError as e:
        return str(e)


def _emulator(test_id):
    """The emulator backend for test_id, built once; a str is the reason it cannot run here."""
    if test_id not in _emulators:
        name, spec = DEVICES[test_id]
        if shutil.which("g++") is None:
            _emulators[test_id] = f"g++ is needed to run the {name} kernels on the CPU emulator"
        elif name == "metal" and sys.platform == "darwin":
            _emulators[test_id] = "on macOS the real Metal device is tested instead"
        else:
            import importlib
            module, cls = spec.split(":")
            try:
                _emulators[test_id] = getattr(importlib.import_module(module), cls)()
            except tallow.DeviceError as e:
                _emulators[test_id] = str(e)
    return _emulators[test_id]


def emulated(test_id):
    """The emulator backend of test_id ("cuda-emulator", "metal-emulator"); a skip with the
    reason where it cannot run here."""
    backend = _emulator(test_id)
    if isinstance(backend, str):
        pytest.skip(f"device {test_id} is not available here: {backend}")
    return backend


@pytest.fixture
def device(request):
    """Each test body runs once per device; an absent device is a skip with the reason."""
    name, spec = DEVICES[request.param]
    if spec == "chromium":
        backend = request.getfixturevalue("chromium_wasm_backend")
        dev = device_module.use_backend(name, backend)
        try:
            assert tallow.Device(name).backend is backend  # the test's kernels really run in Chromium
            yield dev
        finally:
            device_module.restore_backend(name)
        return
    if spec is None:
        reason = _probe(name)
        if reason:
            pytest.skip(f"device {name} is not available here: {reason}")
        yield tallow.Device(name)
        return
    for prefix, reason in EMULATOR_LIMITS.items():
        if request.node.nodeid.startswith(prefix):
            pytest.skip(f"not on {request.param}: {reason}")
    backend = emulated(request.param)
    dev = device_module.use_backend(name, backend)
    try:
        assert tallow.Device(name).backend is backend  # the test really runs on the emulated kernels
        yield dev
    finally:
        device_module.restore_backend(name)


@pytest.fixture(scope="session")
def chromium_wasm_backend():
    """The "wasm-chromium" device's backend: a WasmBackend whose kernels run in one headless
    Chromium (WebGPU disabled) for the whole session, through tests/browser/chromium_wasm_driver.py;
    a skip with the reason where Chromium, Playwright or kernels.wasm is missing (a failure under
    TALLOW_REQUIRE_BROWSER=1, as for the other browser tests)."""
    import importlib.util
    folder = Path(__file__).parent / "browser"
    loaded = {}
    for name in ("harness", "chromium_wasm_driver"):
        spec = importlib.util.spec_from_file_location(f"tallow_tests_browser_{name}_conftest", folder / f"{name}.py")
        loaded[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded[name])
    harness, chromium = loaded["harness"], loaded["chromium_wasm_driver"]
    missing = chromium.missing_requirements(harness.CHROMIUM)
    if missing:  # (require_browser(None) would ask for the page's npm packages too, which this needs not)
        harness.require_browser(missing)
    from tallow.backends.wasm.backend import WasmBackend
    with chromium.ChromiumWasm(harness.CHROMIUM) as browser:
        yield WasmBackend(browser.driver())


@pytest.fixture
def slow_device(device, request):
    """True on SLOW_DEVICES: model tests run a smaller input there (shorter audio, fewer steps)."""
    return request.node.callspec.params["device"] in SLOW_DEVICES


@pytest.fixture
def model_device(device, request):
    """`device` for tests that run a real checkpoint; skipped on SLOW_DEVICES with the reason."""
    test_id = request.node.callspec.params["device"]
    if test_id in SLOW_DEVICES:
        pytest.skip(f"a real checkpoint takes many minutes on {test_id} ({SLOW_DEVICES[test_id]}); "
                    "random-weight tiny models cover this device")
    return device


# ---- test data: one place, honouring $TALLOW_HOME (where `tallow fetch` puts models) ----------
@pytest.fixture
def wgpu():
    """The wgpu device (lavapipe here), or a skip saying why there is none."""
    try:
        return tallow.Device("wgpu")
    except tallow.errors.DeviceError as e:
        pytest.skip(str(e))


# The devices that capture and replay decode steps (tallow.capture): wgpu (lavapipe here), and
# the CUDA and Metal kernels on their CPU emulators.
CAPTURING_DEVICES = ("wgpu", "cuda-emulator", "metal-emulator")


@pytest.fixture(params=CAPTURING_DEVICES)
def capture_device(request):
    """A device that captures and replays decode steps; a skip saying why where it is absent."""
    if request.param == "wgpu":
        try:
            dev = tallow.Device("wgpu")
        except tallow.errors.DeviceError as e:
            pytest.skip(str(e))
        yield dev
        return
    name = DEVICES[request.param][0]
    dev = device_module.use_backend(name, emulated(request.param))
    try:
        yield dev
    finally:
        device_module.restore_backend(name)


@pytest.fixture
def null_wgpu():
    """(device, driver): the wgpu backend over the do-nothing driver, which counts dispatches."""
    from tallow_wgpu.backend import WgpuBackend
    from tallow_wgpu.driver_null import NullDriver
    driver = NullDriver()
    yield device_module.use_backend("wgpu", WgpuBackend(driver)), driver
    device_module.restore_backend("wgpu")


@pytest.fixture(scope="session")
def tallow_home():
    """The model cache: $TALLOW_HOME, default ~/.cache/tallow."""
    return Path(tallow.hub.home())


def _cached(path, what):
    if not path.exists():
        pytest.skip(f"{what} is not in the tallow cache ({path}): run `tallow fetch {what.split()[0]}`")
    return path


@pytest.fixture(scope="session")
def whisper_tiny_dir(tallow_home):
    """The fetched whisper-tiny.en folder (config.json, model.safetensors, tokenizer.json)."""
    return _cached(tallow_home / "whisper-tiny.en" / "model.safetensors", "whisper-tiny.en weights").parent


@pytest.fixture(scope="session")
def whisper_assets_dir(tallow_home):
    """The fetched whisper-assets folder (mel_filters.npz, the tiktoken vocabularies)."""
    return _cached(tallow_home / "whisper-assets" / "mel_filters.npz", "whisper-assets mel filters").parent


@pytest.fixture(scope="session")
def smollm2_gguf(tallow_home):
    """The SmolLM2-135M-Instruct Q4_1 GGUF: $TALLOW_SMOLLM2_GGUF (a file or a folder), else the cache."""
    env = os.environ.get("TALLOW_SMOLLM2_GGUF")
    if env:
        path = Path(env)
        found = sorted(path.glob("*.gguf")) if path.is_dir() else [path]
        if not found or not found[0].is_file():
            pytest.fail(f"TALLOW_SMOLLM2_GGUF={env} names no GGUF file")
        return found[0]
    return _cached(tallow_home / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def jfk_wav():
    """The 11 s JFK clip (16 kHz mono WAV) kept in the repository."""
    return DATA / "jfk.wav"


# Tests that read real model files carry the `models` marker, so `make check` (the fast loop)
# can leave them out without each test saying so.
MODEL_FIXTURES = frozenset({"whisper_tiny_dir", "whisper_assets_dir", "smollm2_gguf"})


# A whole model on a g++ CPU emulator (capture and replay, random-weight Whisper or Llama against
# transformers) takes 5-65 s there: tests marked `emulated_model` are also `slow` on the emulators,
# so `make check` runs them on cpu, python and wgpu and `make test` everywhere. The op cases stay in
# the fast loop on every device.
EMULATED = frozenset({"cuda-emulator", "metal-emulator"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.models)
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("device") == "wasm-chromium":
            item.add_marker(pytest.mark.browser)
        if (item.get_closest_marker("emulated_model") and params is not None
                and EMULATED.intersection(v for v in params.params.values() if isinstance(v, str))):
            item.add_marker(pytest.mark.slow)
