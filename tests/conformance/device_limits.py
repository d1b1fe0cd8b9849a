"""What a device truly cannot do, in one table per kind of limit, each with its reason. A test
that meets a limit expects exactly the UnsupportedError the device must raise there (never a
skip, never a silently narrowed answer). cases.py keeps its own NO_F64 (it runs in Pyodide and
imports only tallow); the f64 rows here are built from it."""
import numpy as np
import pytest

from tallow.errors import UnsupportedError

from cases import NO_F64

# (device type, dtype name) -> why the device has no such tensors (the error names the dtype).
NO_DTYPE = {(device, "f64"): {"wgpu": "WGSL has no f64", "metal": "Metal has no double"}[device] for device in NO_F64}

# (device type, dtype name) -> (lo, hi): the integers the device keeps that dtype in. Values outside
# are refused on upload, and results that would leave the range raise UnsupportedError ("i32 range").
NARROW_INTS = {("wgpu", "i64"): (-2 ** 31, 2 ** 31 - 1)}  # WebGPU has no 64-bit integers: i64 lives as i32

# (device type, op) -> why the device refuses it.
NO_OP = {("metal", "scatter_add i64"): "no 64-bit atomics in MSL"}


def refused(device, *dtypes):
    """True (after checking the refusal) when the device cannot hold one of dtypes: uploading
    it raises UnsupportedError naming the dtype. The caller then stops: there is nothing to compute."""
    for dtype in dtypes:
        if (device.type, dtype.name) in NO_DTYPE:
            with pytest.raises(UnsupportedError, match=dtype.name):
                device.backend.from_bytes(bytes(dtype.itemsize * 4), dtype)
            with pytest.raises(UnsupportedError, match=dtype.name):
                device.backend.from_list([1.0, 2.0], dtype)
            return True
    return False


def int_range(device, dtype):
    """(lo, hi) of the integers the device holds in dtype."""
    if (device.type, dtype.name) in NARROW_INTS:
        return NARROW_INTS[device.type, dtype.name]
    if dtype.name == "bool":
        return 0, 1
    info = np.iinfo(dtype.np_name)
    return int(info.min), int(info.max)


def exact_ints(device, dtype, ref, run):
    """run() -> a flat list equal to ref's; where the device keeps dtype in fewer bits (NARROW_INTS)
    and ref leaves that range, run() must raise UnsupportedError instead (never a narrower wrap)."""
    lo, hi = int_range(device, dtype)
    ref = np.asarray(ref)
    if ref.size and (ref.min() < lo or ref.max() > hi):
        with pytest.raises(UnsupportedError, match="i32 range"):
            run()
        return
    assert run() == ref.ravel().tolist()
