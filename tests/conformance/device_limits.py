"""What a device truly cannot do, in one table per kind of limit, each with its reason. A test
that meets a limit expects exactly the UnsupportedError the device must raise there (never a
skip, never a silently narrowed answer). cases.py keeps its own NO_F64 (it runs in Pyodide and
imports only tallow); the f64 rows here are built from it."""
from cases import NO_F64

# (device type, dtype name) -> why the device has no such tensors (the error names the dtype).
NO_DTYPE = {(device, "f64"): {"wgpu": "WGSL has no f64", "metal": "Metal has no double"}[device] for device in NO_F64}

# (device type, dtype name) -> (lo, hi): the integers the device keeps that dtype in. Values outside
# are refused on upload, and results that would leave the range raise UnsupportedError ("i32 range").
NARROW_INTS = {("wgpu", "i64"): (-2 ** 31, 2 ** 31 - 1)}  # WebGPU has no 64-bit integers: i64 lives as i32

# (device type, op) -> why the device refuses it.
NO_OP = {("metal", "scatter_add i64"): "no 64-bit atomics in MSL"}
