"""Shared fixtures: the device parametrisation every op test runs under."""
import pytest

import tallow

ALL_DEVICES = ("cpu", "python", "wgpu", "cuda", "metal")


def _probe(name):
    try:
        tallow.Device(name)
        return None
    except tallow.DeviceError as e:
        return str(e)


@pytest.fixture(params=ALL_DEVICES)
def device(request):
    """Each test body runs once per device; an absent device is a skip with the reason."""
    reason = _probe(request.param)
    if reason:
        pytest.skip(f"device {request.param} is not available here: {reason}")
    return tallow.Device(request.param)
