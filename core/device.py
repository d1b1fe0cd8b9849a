"""Devices: a name ("cpu", "python", "wgpu", "cuda", "metal", "wasm") bound to a backend.

Backends are found by name and imported only when first used, so `import
tallow` never imports numpy or a GPU package.
"""
import importlib

from .errors import DeviceError
from .settings import settings

# name -> (module, class, what to install when the import fails)
_BACKENDS = {
    "cpu": ("tallow.backends.cpu.backend", "NumpyBackend", "pip install numpy (or use Device('python'))"),
    "python": ("tallow.backends.python_backend", "PythonBackend", ""),
    "wgpu": ("tallow_wgpu.backend", "WgpuBackend", "pip install 'tallow[wgpu]'"),
    "cuda": ("tallow_cuda.backend", "CudaBackend", "pip install 'tallow[cuda]' on a machine with an NVIDIA GPU"),
    "metal": ("tallow_metal.backend", "MetalBackend", "pip install 'tallow[metal]' on macOS"),
    # kernels.wasm under wasmtime (the page's twin is bound by its worker: BrowserWasmDriver)
    "wasm": ("tallow.backends.wasm.backend", "WasmBackend", "pip install wasmtime"),
}
_ALIASES = {"numpy": "cpu", "webgpu": "wgpu", "gpu": None}
_instances: dict[str, "Device"] = {}
_bound: dict[str, list] = {}  # name -> stack of (previous Device or None, previous default) for restore_backend


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
    """Bind the device name `name` to a backend you supply, until `restore_backend(name)`.

    `backend` is a backend instance (for example the wgpu backend over the browser's
    navigator.gpu, built asynchronously), or a class or zero-argument factory that builds
    one (called here, once). Returns the Device, whose `type` stays `name`: code that asks
    for Device(name) gets this backend until it is restored. Bindings nest, and
    `restore_backend(name)` undoes the latest one. While bound, the name is never picked
    implicitly by default_device() (a test double or an emulator must not capture tensors
    made without a device); TALLOW_DEVICE or set_default_device can still ask for it.

        dev = tallow.device.use_backend("cuda", CudaCpuEmulatorBackend)
        try:
            ...  # Device("cuda") runs the CUDA kernels on the CPU emulator
        finally:
            tallow.device.restore_backend("cuda")
    """
    if name not in _BACKENDS:
        raise DeviceError(f"unknown device {name!r}; known: {', '.join(_BACKENDS)}")
    if isinstance(backend, type) or (callable(backend) and not hasattr(backend, "features")):
        backend = backend()
    if not hasattr(backend, "features"):
        raise DeviceError(f"use_backend({name!r}, ...): {backend!r} is not a backend (no features()); "
                          "pass a tallow backend instance, class or factory")
    _bound.setdefault(name, []).append((_instances.get(name), _default))
    dev = object.__new__(Device)
    dev.type = name
    dev._backend = backend
    _instances[name] = dev
    return dev


def restore_backend(name):
    """Undo the latest use_backend(name): the name means again what it meant before."""
    global _default
    stack = _bound.get(name)
    if not stack:
        raise DeviceError(f"restore_backend({name!r}): no use_backend({name!r}, ...) to undo")
    previous, previous_default = stack.pop()
    if not stack:
        del _bound[name]
    current = _instances.pop(name, None)
    if previous is not None:
        _instances[name] = previous
    if _default is current or previous_default is None:
        _default = previous_default


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
        env = settings().device
        if env:
            _default = Device(env)
        else:
            for name in ("cuda", "metal", "cpu", "python"):
                if name in _bound:
                    continue  # bound by use_backend: only on request
                try:
                    _default = Device(name)
                    break
                except DeviceError:
                    continue
    return _default


def set_default_device(device):
    global _default
    _default = Device(device)
