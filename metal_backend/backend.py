"""The Metal backend: tallow's backend contract as MSL kernels (core/backends/gpu_kernels/,
written once for CUDA and Metal, plus kernels/matmul.metal) driven through PyObjC on Apple
silicon. The op logic is tallow.backends.kernel's KernelBackend, shared with CUDA. Differences from CUDA: no f64
(Metal has no double), no i64 scatter_add (no 64-bit atomics), float scalars as float,
and a tiled MSL matmul kernel instead of cuBLAS.
"""
from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.kernel.host import I32, Meta, pack_meta
from tallow.dtypes import bf16, f16, f32, i32, i64
from tallow.layout import numel_of

from .driver import MetalDriver

TILE = 16
MATMUL_DTYPES = (f32, f16, bf16, i32, i64)


class MetalBackend(KernelBackend):
    name = "metal"

    def __init__(self):
        super().__init__(MetalDriver())  # raises DeviceError saying what is missing

    def features(self):
        dev = self.driver.device
        return {"backend": "metal", "adapter": str(dev.name()), "unified_memory": bool(dev.hasUnifiedMemory()),
                "f16": True, "bf16": True, "f64": False, **self.plan_features()}

    source_language = "msl"

    def custom_source(self, op):
        return op.msl

    def matmul(self, a, b, dtype):
        (a, la), (b, lb) = a, b
        if dtype not in MATMUL_DTYPES:
            self._missing(f"matmul on {dtype.name}")
        batch = la.shape[:-2]
        m, k = la.shape[-2:]
        n = lb.shape[-1]
        count = numel_of(batch)
        out = self._new(count * m * n, dtype)
        if count * m * n == 0:
            return out
        if k == 0:
            return self.full(count * m * n, 0, dtype)
        meta = pack_meta(batch, [(la.offset, la.strides[:-2]), (lb.offset, lb.strides[:-2])], "matmul")
        mk = Meta([la.strides[-2], la.strides[-1], lb.strides[-2], lb.strides[-1]])
        grid = ((n + TILE - 1) // TILE, (m + TILE - 1) // TILE, count)
        self._launch("matmul", f"matmul_{dtype.name}", grid, (TILE, TILE, 1),
                           [a, b, out, meta, mk, I32(m), I32(n), I32(k)])
        return out
