"""Devices: a name ("cpu", "python", "wgpu", "cuda", "metal") bound to a backend.

Backends are found by name and imported only when first used, so `import
tallow` never imports numpy or a GPU package.
"""
import importlib
import os

from .errors import DeviceError

# name -> (module, class, what to install when the import fails)
_BACKENDS = {
    "cpu": ("tallow.backends.numpy_backend", "NumpyBackend", "pip install numpy (or use Device('python'))"),
    "python": ("tallow.backends.python_backend", "PythonBackend", ""),
    "wgpu": ("tallow_wgpu.backend", "WgpuBackend", "pip install 'tallow[wgpu]'"),
    "cuda": ("tallow_cuda.backend", "CudaBackend", "pip install 'tallow[cuda]' on a machine with an NVIDIA GPU"),
    "metal": ("tallow_metal.backend", "MetalBackend", "pip install 'tallow[metal]' on macOS"),
}
_ALIASES = {"numpy": "cpu", "webgpu": "wgpu", "gpu": None}
_instances = {}


class Device:
    """A compute device. `Device("cpu")` is numpy, `Device("python")` pure Python."""

    __slots__ = ("type", "_backend")

    def __new__(cls, name="cpu"):
        if isinstance(name, Device):
            return name
        key = _ALIASES.get(name, name) if name != "gpu" else _best_gpu()
        if key not in _BACKENDS:
            raise DeviceError(f"unknown device {name!r}; known: {', '.join(_BACKENDS)}")
        dev = _instances.get(key)
        if dev is None:
            dev = object.__new__(cls)
            dev.type = key
            dev._backend = _load_backend(key)
            _instances[key] = dev
        return dev

    @property
    def backend(self):
        return self._backend

    def __repr__(self):
        return f"Device({self.type!r})"

    def __str__(self):
        return self.type

    def __eq__(self, other):
        if isinstance(other, str):
            return self.type == _ALIASES.get(other, other)
        return self is other

    def __hash__(self):
        return hash(self.type)

    def __reduce__(self):
        return (Device, (self.type,))


def use_backend(name, backend):
    """Bind a device name to a backend instance you built (for example the wgpu backend over
    the browser's navigator.gpu, made asynchronously); returns the Device."""
    if name not in _BACKENDS:
        raise DeviceError(f"unknown device {name!r}; known: {', '.join(_BACKENDS)}")
    dev = object.__new__(Device)
    dev.type = name
    dev._backend = backend
    _instances[name] = dev
    return dev


def _load_backend(key):
    module_name, class_name, hint = _BACKENDS[key]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise DeviceError(f"device {key!r} is not available: {e}. {hint}".strip()) from None
    return getattr(module, class_name)()


def _best_gpu():
    for name in ("cuda", "metal", "wgpu"):
        if _available(name):
            return name
    raise DeviceError("no GPU device is available here; `tallow devices` lists what works")


def _available(name):
    try:
        Device(name)
        return True
    except DeviceError:
        return False


def devices():
    """{name: features} for every device that works here."""
    found = {}
    for name in _BACKENDS:
        try:
            found[name] = Device(name).backend.features()
        except DeviceError:
            pass
    return found


def unavailable():
    """{name: reason} for the devices that do not work here."""
    reasons = {}
    for name in _BACKENDS:
        try:
            Device(name)
        except DeviceError as e:
            reasons[name] = str(e)
    return reasons


_default = None


def default_device():
    """$TALLOW_DEVICE if set, else the best device here: cuda, metal, then numpy, then pure Python.
    wgpu is never picked implicitly: probing an adapter costs seconds, and a CPU-emulated one
    (lavapipe, SwiftShader) is slower than numpy. Ask for it with Device("wgpu") or TALLOW_DEVICE=wgpu."""
    global _default
    if _default is None:
        env = os.environ.get("TALLOW_DEVICE")
        if env:
            _default = Device(env)
        else:
            for name in ("cuda", "metal", "cpu", "python"):
                try:
                    _default = Device(name)
                    break
                except DeviceError:
                    continue
    return _default


def set_default_device(device):
    global _default
    _default = Device(device)
