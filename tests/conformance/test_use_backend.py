"""tallow.device.use_backend / restore_backend: binding a device name to a backend of your
own (the browser's wgpu backend, the CUDA/Metal CPU emulators the suite runs on)."""
import functools

import pytest

import tallow
from tallow.backends.python_backend import PythonBackend
from tallow.device import restore_backend, use_backend


class CountingBackend(PythonBackend):
    """The pure-Python backend, counting the unary ops it runs (proves which backend ran)."""

    def __init__(self, tag="counting"):
        super().__init__()
        self.tag, self.unary_calls = tag, 0

    def unary(self, *args, **kwargs):
        self.unary_calls += 1
        return super().unary(*args, **kwargs)


@pytest.mark.parametrize("how", ["instance", "class", "factory"])
def test_a_bound_backend_runs_the_ops_until_restored(how):
    made = {"instance": CountingBackend(), "class": CountingBackend,
            "factory": functools.partial(CountingBackend, tag="made")}[how]
    before = tallow.Device("python").backend
    dev = use_backend("python", made)
    try:
        backend = dev.backend
        assert isinstance(backend, CountingBackend) and (how != "factory" or backend.tag == "made")
        assert tallow.Device("python") is dev and dev.type == "python"
        assert tallow.tensor([1.0, 4.0], device="python").sqrt().tolist() == [1.0, 2.0]
        assert backend.unary_calls == 1
    finally:
        restore_backend("python")
    assert tallow.Device("python").backend is before


def test_bindings_nest_and_a_bound_name_is_never_the_implicit_default(monkeypatch):
    monkeypatch.delenv("TALLOW_DEVICE", raising=False)
    monkeypatch.setattr(tallow.device, "_default", None)  # as in a fresh process
    outer = use_backend("cpu", CountingBackend("outer"))
    inner = use_backend("cpu", CountingBackend("inner"))
    try:
        assert tallow.Device("cpu") is inner
        assert tallow.default_device().type != "cpu"  # a bound name is not picked implicitly
        restore_backend("cpu")
        assert tallow.Device("cpu") is outer
    finally:
        restore_backend("cpu")
    assert not isinstance(tallow.Device("cpu").backend, CountingBackend)


def test_bad_bindings_are_clear_errors():
    with pytest.raises(tallow.DeviceError, match="unknown device 'tpu'"):
        use_backend("tpu", CountingBackend())
    with pytest.raises(tallow.DeviceError, match="is not a backend"):
        use_backend("python", object())
    with pytest.raises(tallow.DeviceError, match="no use_backend\\('wgpu', ...\\) to undo"):
        restore_backend("wgpu")
