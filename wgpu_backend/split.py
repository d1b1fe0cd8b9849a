"""Tensors larger than one storage binding: the binding limit the backend assumes,
and how a weight is cut into row ranges that each fit one binding.

WebGPU binds at most `maxStorageBufferBindingSize` bytes of a buffer to one
kernel argument (128 MiB by default, 128 MiB on lavapipe, up to the adapter's
own limit when asked for), while a buffer may be larger (`maxBufferSize`).
A big weight (Phi-2's Q8_0 embedding is 139 MB) therefore lives in one buffer
and is bound piece by piece: each piece is a range of whole rows starting at
an offset the adapter accepts (`minStorageBufferOffsetAlignment`), and each
dispatch computes that piece's slice of the output.

TALLOW_WGPU_MAX_BINDING_MB (a float: 0.0625 is 64 KiB) lowers the limit the
backend assumes, so tests exercise the splitting with small tensors.
"""
import math

from tallow.errors import DeviceError, UnsupportedError
from tallow.settings import Settings, settings

ENV = "TALLOW_WGPU_MAX_BINDING_MB"
MIN_BINDING = 4096  # below this, kernels' own small buffers would not fit


def binding_limit(adapter_limit, align, requested=None, env=None):
    """The binding size the backend assumes: the adapter's, or a lower one asked for (bytes, or
    $TALLOW_WGPU_MAX_BINDING_MB), rounded down to the offset alignment."""
    mb = (settings() if env is None else Settings.from_env(env)).wgpu_max_binding_mb  # checked there
    if requested is None and mb is not None:
        requested = int(mb * (1 << 20))
    if requested is None:
        return adapter_limit
    if requested < MIN_BINDING:
        raise DeviceError(f"wgpu binding limit {requested} bytes is too small: at least {MIN_BINDING} bytes "
                          f"({ENV} >= {MIN_BINDING / (1 << 20):g})")
    return min(adapter_limit, requested // align * align)


def row_pieces(rows, row_bytes, limit, align, what):
    """[(first_row, end_row)] covering `rows` rows of `row_bytes` each, every piece starting at a
    byte offset that is a multiple of `align` and spanning at most `limit` bytes (rounded up to 4)."""
    if (rows * row_bytes + 3) // 4 * 4 <= limit:
        return [(0, rows)]
    step = align // math.gcd(row_bytes, align)  # rows between aligned starts
    per = (limit // row_bytes) // step * step
    if per == 0:
        raise UnsupportedError(f"wgpu {what}: rows of {row_bytes} bytes cannot be split into bindings of at most "
                               f"{limit} bytes starting at {align}-byte offsets ({step} rows are the smallest piece)")
    return [(r, min(r + per, rows)) for r in range(0, rows, per)]
