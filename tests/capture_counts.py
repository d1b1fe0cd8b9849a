"""Counting a backend's captures and replays, and the devices that capture
(tests/test_capture.py, test_whisper_capture.py)."""
import pytest

import tallow
from tallow import device as device_module

# wgpu (lavapipe here), and the CUDA and Metal kernels on their CPU emulators (conftest.DEVICES).
CAPTURING_DEVICES = ("wgpu", "cuda-emulator", "metal-emulator")
EMULATED = ("cuda-emulator", "metal-emulator")


@pytest.fixture(params=CAPTURING_DEVICES)
def capture_device(request):
    """A device that captures and replays decode steps; a skip saying why where it is absent."""
    from conftest import DEVICES, emulated
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


def is_emulated(request):
    """Whether the test runs on a CPU emulator (slow: tests take fewer steps there)."""
    return request.node.callspec.params.get("capture_device") in EMULATED


def count_captures(monkeypatch, backend):
    """{"capture": n, "replay": m}, kept up to date as the backend begins captures and replays."""
    calls = {"capture": 0, "replay": 0}
    begin, replay = backend.begin_capture, backend.replay

    def counted_begin(*a):
        calls["capture"] += 1
        return begin(*a)

    def counted_replay(*a):
        calls["replay"] += 1
        return replay(*a)
    monkeypatch.setattr(backend, "begin_capture", counted_begin)
    monkeypatch.setattr(backend, "replay", counted_replay)
    return calls
