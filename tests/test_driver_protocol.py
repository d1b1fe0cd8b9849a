"""Every GPU driver implements the one driver protocol (tallow/backends/driver_protocol.py): the
members every driver has, plus its launch form's (kernel: CUDA/Metal/emulators/null; WGSL: the
three wgpu drivers; wasm calls: wasmtime), each method taking the protocol's parameters."""
import inspect

import pytest

from tallow.backends import driver_protocol as dp


def _members(protocol):
    """(method name -> parameter count, attribute names) the protocol and its bases declare."""
    methods, attrs = {}, set()
    for cls in protocol.__mro__:
        if cls in (dp.Driver, dp.KernelDriver, dp.WgslDriver, dp.WasmDriver):
            attrs.update(vars(cls).get("__annotations__", {}))
            for name, fn in vars(cls).items():
                if inspect.isfunction(fn) and not name.startswith("_"):
                    methods[name] = len(inspect.signature(fn).parameters)
    return methods, attrs


def method_gaps(cls, protocol):
    """What cls lacks of the protocol's methods, or takes with another parameter count."""
    methods, _ = _members(protocol)
    gaps = []
    for name, count in sorted(methods.items()):
        fn = getattr(cls, name, None)
        if fn is None:
            gaps.append(f"{cls.__name__}.{name} is missing")
        elif len(inspect.signature(fn).parameters) != count:
            gaps.append(f"{cls.__name__}.{name}{inspect.signature(fn)} takes {count - 1} arguments in the protocol")
    return gaps


def attribute_gaps(driver, protocol):
    _, attrs = _members(protocol)
    return [f"{type(driver).__name__}.{a} is missing" for a in sorted(attrs) if not hasattr(driver, a)]


def _driver_classes():
    from tallow.backends.kernel.emulator import EmulatedDriver
    from tallow.backends.kernel.null_driver import NullKernelDriver
    from tallow_cuda.cpu_driver import CpuCudaDriver
    from tallow_cuda.driver import CupyDriver
    from tallow_metal.cpu_driver import CpuMetalDriver
    from tallow_metal.driver import MetalDriver
    from tallow_wgpu.driver_browser import BrowserDriver
    from tallow_wgpu.driver_native import NativeDriver
    from tallow_wgpu.driver_null import NullDriver
    kernel = [CupyDriver, MetalDriver, EmulatedDriver, CpuCudaDriver, CpuMetalDriver, NullKernelDriver]
    from tallow.backends.wasm.driver_browser import BrowserWasmDriver
    from tallow.backends.wasm.driver_native import WasmtimeDriver
    return [(c, dp.KernelDriver) for c in kernel] + [(c, dp.WgslDriver) for c in (NativeDriver, BrowserDriver,
                                                                                  NullDriver)] + [
        (WasmtimeDriver, dp.WasmDriver), (BrowserWasmDriver, dp.WasmDriver)]


@pytest.mark.parametrize("cls, protocol", _driver_classes(), ids=lambda v: getattr(v, "__name__", ""))
def test_every_driver_has_its_forms_methods(cls, protocol):
    assert method_gaps(cls, protocol) == []


def test_both_forms_share_the_common_methods():
    common, _ = _members(dp.Driver)
    assert set(common) == {"alloc", "download", "write", "record", "replay"}
    for form in (dp.KernelDriver, dp.WgslDriver, dp.WasmDriver):
        assert common.items() <= _members(form)[0].items()


def test_a_driver_missing_a_member_is_reported():
    class Partial:
        name, can_replay = "partial", True

        def alloc(self, nbytes):  # the old wgpu spelling: one argument
            return None

        def download(self, buf, byte_offset, nbytes):
            return b""

    gaps = method_gaps(Partial, dp.Driver)
    assert gaps == ["Partial.alloc(self, nbytes) takes 2 arguments in the protocol", "Partial.record is missing",
                    "Partial.replay is missing", "Partial.write is missing"]
    assert attribute_gaps(Partial(), dp.KernelDriver) == ["Partial.atomic64 is missing", "Partial.has_f64 is missing"]


def test_driver_instances_have_their_forms_attributes(wgpu):
    from tallow.backends.kernel.null_driver import NullKernelDriver
    from tallow_wgpu.driver_null import NullDriver
    assert attribute_gaps(NullKernelDriver(), dp.KernelDriver) == []
    assert attribute_gaps(NullDriver(), dp.WgslDriver) == []
    assert attribute_gaps(wgpu.backend.driver, dp.WgslDriver) == []  # the native driver, on lavapipe here


def test_the_wasmtime_driver_has_the_wasm_forms_attributes():
    pytest.importorskip("wasmtime", reason="the wasm driver runs kernels.wasm under wasmtime (the dev extra)")
    pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
    from tallow.backends.wasm import build
    from tallow.backends.wasm.driver_native import WasmtimeDriver
    if build.linker() is None:
        pytest.skip("no wasm-ld here")
    assert attribute_gaps(WasmtimeDriver(build.build()), dp.WasmDriver) == []
