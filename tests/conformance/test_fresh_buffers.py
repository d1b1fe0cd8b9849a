"""The promise the GPU buffer pool rests on: every op writes each element of a new storage before
it reads it. A reused buffer holds an earlier tensor's bytes and CuPy's memory is never zeroed, so
the shared op cases run on the CUDA and Metal kernels (CPU emulators) with every new buffer full of
0xFF bytes (NaN in f32, -1 in integers) and an empty pool: a read of an unwritten element shows."""
import numpy as np
import pytest

import cases
from compare import assert_matches
from conftest import emulated
from tallow import device as device_module


@pytest.fixture(params=["cuda-emulator", "metal-emulator"])
def poisoned_device(request, monkeypatch):
    """An emulated kernel backend whose every new buffer starts as 0xFF bytes (NaN in f32, -1 in
    integers) and whose pool starts empty: an op that reads an element it never wrote shows it."""
    backend = emulated(request.param)
    alloc = backend.driver.alloc

    def dirty_alloc(dtype, numel):
        st = alloc(dtype, numel)
        st.buf[:] = 0xFF
        return st
    monkeypatch.setattr(backend.driver, "alloc", dirty_alloc)
    backend.pool.clear()
    name = request.param.split("-")[0]
    yield device_module.use_backend(name, backend)
    device_module.restore_backend(name)
    backend.pool.clear()


def test_new_storages_are_written_before_they_are_read(poisoned_device):
    ran = 0
    for name in sorted(cases.CASES):
        case = cases.CASES[name]
        if case.not_applicable(poisoned_device.type):
            continue
        if case.torch:
            pytest.importorskip("torch")
        rtol, atol = case.tolerance(poisoned_device.type)
        assert_matches(cases.run(name, poisoned_device), case.reference(np), f"{name} on dirty buffers", rtol, atol)
        ran += 1
    assert ran >= 15
