"""Test-only: a driver that runs tallow's CUDA C kernels on the CPU, so the kernels and
the host logic (tallow.backends.kernel) are executed and checked against numpy on machines
without an NVIDIA GPU.

Each module's CUDA C source (driver.kernel_source, the text NVRTC gets) is compiled by g++
as C++17 with cuda_cpu_shim.h (blocks run as fibers: __syncthreads and __shfl_down_sync
synchronise; see core/backends/kernel/cpu_fibers.h)
and a generated wrapper per kernel taking its arguments as CuPy passes them (pointers, and
scalars of driver.SCALAR_TYPES). Dense matmul, which is cuBLAS on a GPU, is numpy here.
Libraries are cached by source hash in $TALLOW_CPU_EMULATOR_CACHE (default: the temp dir).

What this does not show: that nvcc/NVRTC accept the sources (test_kernel_sources.py
does), warp-level behaviour beyond the shuffles used, races between blocks, speed.
"""
import os
import re
import struct

from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.kernel.emulator import FIBERS, EmulatedDriver, compile_emulated, source_file
from tallow.backends.kernel.host import Meta
from tallow.backends.operand import Operand
from tallow.dtypes import bf16, f16
from tallow.layout import numel_of

from .backend import CudaBackend
from .driver import SCALAR_TYPES, kernel_source

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "cuda_cpu_shim.h")
MODULES = ("elementwise", "reduce", "index", "attention", "quant")
FIBER_MODULES = ("reduce", "attention", "quant")  # kernels with __syncthreads or shuffles
_STRUCT = {"int32": "<i", "int64": "<q", "uint32": "<I", "uint64": "<Q", "float64": "<d"}


# ---- building ------------------------------------------------------------------------------
def kernel_params(preprocessed):
    """{kernel: [C type, ...]} of every extern "C" kernel in the preprocessed source."""
    found = {}
    for m in re.finditer(r'extern "C"\s+void\s+(\w+)\s*\(([^)]*)\)', preprocessed):
        found[m.group(1)] = [re.match(r"(.*?)\s*\w+$", p.strip()).group(1) for p in m.group(2).split(",")]
    return found


def cuda_wrappers(preprocessed):
    out = []
    for name, types in kernel_params(preprocessed).items():
        exprs = [f"({t})a[{i}]" if t.endswith("*") else f"*({t}*)a[{i}]" for i, t in enumerate(types)]
        out.append(f"static void tallow_entry_{name}(void** a, const TallowCtx*) {{ {name}({', '.join(exprs)}); }}\n"
                   f'extern "C" void tallow_launch_{name}(void** a, const unsigned* g, const unsigned* b, int f) '
                   f"{{ tallow_run(tallow_entry_{name}, a, g, b, f); }}\n")
    return "".join(out)


def build_custom(source, gxx="g++"):
    """Path of the shared library for a CustomOp's CUDA source (fibers: it may synchronise)."""
    path = source_file("cuda-custom", source, ".cu")
    return compile_emulated(os.path.basename(path)[:-3], [FIBERS, SHIM, path], gxx, preprocess=["-include", SHIM, path],
                            unit=f'#include "{path}"\n', runtime=SHIM, wrappers=cuda_wrappers)


def build_module(module, gxx="g++"):
    """Path of the shared library for a kernel module (its CUDA C source, as the real driver's)."""
    source = source_file(f"cuda-{module}", kernel_source(module), ".cu")
    return compile_emulated(f"cuda-{module}", [FIBERS, SHIM, source], gxx, preprocess=["-include", SHIM, source],
                            unit=f'#include "{source}"\n', runtime=SHIM, wrappers=cuda_wrappers)


def pack_cuda_arg(a):
    """Bytes of an argument as CuPy passes it: a meta array as int32s, scalars as driver.SCALAR_TYPES."""
    if isinstance(a, Meta):
        return struct.pack(f"<{len(a)}i", *a)
    kind = SCALAR_TYPES.get(type(a))
    if kind is None:
        raise TypeError(f"kernel argument of unknown kind: {a!r}")
    return struct.pack(_STRUCT[kind], a)


# ---- the driver and backend ----------------------------------------------------------------------
class CpuCudaDriver(EmulatedDriver):
    name, language = "cuda", "CUDA"
    has_f64 = atomic64 = True
    modules, fiber_modules = MODULES, FIBER_MODULES

    build_module, build_custom = staticmethod(build_module), staticmethod(build_custom)
    pack = staticmethod(pack_cuda_arg)


class CudaCpuEmulatorBackend(CudaBackend):
    """CudaBackend (the CUDA C kernels and the shared host logic) on the CPU emulator; numpy
    stands in for cuBLAS."""

    def __init__(self):
        KernelBackend.__init__(self, CpuCudaDriver())

    def features(self):
        return {"backend": "cuda kernels on the CPU emulator (test-only)", "f16": True, "bf16": True}

    def matmul(self, a, b, dtype):
        (a, la), (b, lb) = a, b
        few_rows = self._rows_matvec(a, la, b, lb, dtype)  # as CudaBackend.matmul: a few rows take the kernel
        if few_rows is not None:
            return few_rows
        if dtype is bf16:
            return super().matmul(Operand(a, la), Operand(b, lb), dtype)  # f32 through the cast kernels, then back here
        np = self.driver.np
        shape = la.shape[:-1] + lb.shape[-1:]
        out = self.driver.alloc(dtype, numel_of(shape))

        def run():  # into `out`, so that a captured step's replay runs it again (tallow.capture)
            x, y = self._view(a, la, dtype), self._view(b, lb, dtype)
            if dtype is f16:  # cuBLAS accumulates f16 products in f32
                r = np.matmul(x.astype(np.float32), y.astype(np.float32)).astype(np.float16)
            else:
                r = np.matmul(x, y)
            raw = np.ascontiguousarray(r, dtype=dtype.np_name).view(np.uint8).reshape(-1)
            out.buf[:raw.size] = raw
        self._host_call(run, ("matmul", la.shape, la.strides, la.offset, lb.shape, lb.strides, lb.offset, dtype.name))
        return out

    def _view(self, st, layout, dtype):
        from numpy.lib.stride_tricks import as_strided
        arr = st.buf.view(self.driver.np.dtype(dtype.np_name))
        item = arr.itemsize
        return as_strided(arr[layout.offset:], layout.shape, [s * item for s in layout.strides], writeable=False)
