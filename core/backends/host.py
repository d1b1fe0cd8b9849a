"""The host: the CPU device that work handed back from another device runs on (block
formats a GPU's kernels do not read, Whisper's logit filters). numpy's backend when
numpy is importable, else the pure-Python one (Pyodide without numpy): this is the one
place that choice is made, so callers ask the host backend instead of probing for numpy.
"""
from ..device import Device
from ..dtypes import f32, i64
from ..errors import DeviceError
from ..layout import Layout
from .operand import Operand


def host_device():
    """Device("cpu") when numpy is importable, else Device("python")."""
    try:
        return Device("cpu")
    except DeviceError:
        return Device("python")


def dequantize_on_host(blocks, wdtype, numel):
    """Little-endian f32 bytes of `numel` values from raw GGUF blocks, dequantised by the host backend."""
    host = host_device().backend
    values = host.dequantize(host.from_bytes(blocks, wdtype), wdtype, numel, f32)
    return host.to_bytes(values, Layout((numel,)), f32)


def dequantize_rows_on_host(blocks, wdtype, k, ids):
    """Little-endian f32 bytes of the rows `ids` (little-endian i64 bytes) of a quantised (rows, k) matrix."""
    host = host_device().backend
    rows = len(memoryview(blocks).cast("B")) // wdtype.block_bytes * wdtype.block_size // k
    count = len(ids) // 8
    picked = host.index_select(Operand(host.from_bytes(blocks, wdtype), Layout((rows, k))),
                               Operand(host.from_bytes(ids, i64), Layout((count,))), wdtype, 0)
    return host.to_bytes(picked, Layout((count, k)), f32)
