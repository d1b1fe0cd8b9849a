"""Test-only: a driver that runs tallow's MSL kernels on the CPU, so the Metal kernels
and the host logic they share with CUDA (tallow.backends.kernel) can be executed and
checked against numpy on machines without a Mac.

Each module's MSL source (driver.kernel_source, the text Metal gets) is compiled by g++ as
C++17 against msl_shim.h + msl_cpu_runtime.h (threadgroups run as fibers, so barriers and
simd_sum synchronise),
with a generated wrapper per kernel that unpacks the argument list exactly as Metal's
setBuffer/setBytes would bind it (the arguments are packed by tallow_metal.driver.pack_arg,
the real driver's packer). Libraries are cached by source hash.

What this does not show: Metal compiler acceptance, GPU memory-model races across
threadgroups, float rounding differences of Apple GPUs, and speed.
"""
import os
import re

from tallow.errors import UnsupportedError
from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.kernel.emulator import FIBERS, EmulatedDriver, cache_dir, compile_emulated, source_file

from .backend import MetalBackend
from .driver import kernel_source, pack_arg

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ("elementwise", "reduce", "index", "attention", "quant", "matmul")
FIBER_MODULES = ("reduce", "attention", "matmul", "quant")  # kernels with barriers or simd_sum
BUILTINS = {"thread_position_in_grid": "TPIG", "threads_per_grid": "TPG", "threadgroup_position_in_grid": "TGPIG",
            "thread_position_in_threadgroup": "TPITG", "thread_index_in_threadgroup": "TIITG",
            "threads_per_threadgroup": "TPTG", "thread_index_in_simdgroup": "TIISG",
            "simdgroup_index_in_threadgroup": "SIITG"}


def _split_params(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def kernel_signatures(preprocessed):
    """{kernel name: [(C type, attribute), ...]} from the preprocessed source (attributes kept)."""
    found = {}
    for m in re.finditer(r'extern "C"\s+void\s+(\w+)\s*\(', preprocessed):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(preprocessed[i], 0)
            i += 1
        params = []
        for p in _split_params(preprocessed[m.end():i - 1]):
            attr = re.search(r"\[\[\s*(.*?)\s*\]\]", p).group(1)
            decl = re.sub(r"\[\[.*?\]\]", "", p).strip()
            ctype = re.match(r"(.*?)\s*\w+$", decl).group(1).strip()
            params.append((ctype, attr))
        found[m.group(1)] = params
    return found


def wrapper_source(signatures):
    """C++ that exposes each kernel as tallow_launch_<name>(args, grid, block, fibers)."""
    out = []
    for name, params in signatures.items():
        exprs = []
        for ctype, attr in params:
            b = re.match(r"buffer\((\d+)\)", attr)
            if b:
                idx = b.group(1)
                exprs.append(f"({ctype})a[{idx}]" if ctype.endswith("*") else f"*({ctype[:-1].strip()}*)a[{idx}]")
            else:
                exprs.append(f"tallow_builtin<{ctype}>(c, {BUILTINS[attr]})")
        out.append(f"static void tallow_entry_{name}(void** a, const TallowCtx* c) {{ {name}({', '.join(exprs)}); }}\n"
                   f'extern "C" void tallow_launch_{name}(void** a, const unsigned* g, const unsigned* b, int f) '
                   f"{{ tallow_run(tallow_entry_{name}, a, g, b, f); }}\n")
    return "".join(out)


def build_module(module, gxx="g++"):
    """Path of the shared library for a kernel module (its MSL source, as the real driver's;
    built once per source hash)."""
    shim, runtime = os.path.join(HERE, "msl_shim.h"), os.path.join(HERE, "msl_cpu_runtime.h")
    source = source_file(f"metal-{module}", kernel_source(module), ".metal")
    return compile_emulated(f"metal-{module}", [shim, runtime, FIBERS, source, __file__], gxx,
                            preprocess=["-DTALLOW_MSL_KEEP_ATTRIBUTES", "-include", shim, source],
                            unit=f'#include "{source}"\n', runtime=runtime,
                            wrappers=lambda pre: wrapper_source(kernel_signatures(pre)))


def build_custom(source, gxx="g++"):
    """Path of the shared library for a CustomOp's MSL source. Its `#include <metal_stdlib>`
    finds an empty stand-in: msl_shim.h provides what the kernels use."""
    stdlib_dir = os.path.join(cache_dir(), "msl-include")
    os.makedirs(stdlib_dir, exist_ok=True)
    stub = os.path.join(stdlib_dir, "metal_stdlib")
    if not os.path.exists(stub):
        with open(stub, "w") as f:
            f.write("// empty: the CPU emulator's msl_shim.h stands in for Metal's standard library\n")
    shim, runtime = os.path.join(HERE, "msl_shim.h"), os.path.join(HERE, "msl_cpu_runtime.h")
    path = source_file("metal-custom", source, ".metal")
    return compile_emulated(os.path.basename(path)[:-6], [shim, runtime, FIBERS, path, __file__], gxx,
                            preprocess=["-DTALLOW_MSL_KEEP_ATTRIBUTES", "-include", shim, path],
                            unit=f'#include "{path}"\n', runtime=runtime,
                            wrappers=lambda pre: wrapper_source(kernel_signatures(pre)), includes=[stdlib_dir])


class CpuMetalDriver(EmulatedDriver):
    """The MetalDriver interface over numpy byte buffers and g++-compiled kernels."""
    name, language = "metal", "MSL"
    has_f64 = atomic64 = False
    modules, fiber_modules = MODULES, FIBER_MODULES

    build_module, build_custom = staticmethod(build_module), staticmethod(build_custom)
    pack = staticmethod(pack_arg)

    def upload(self, data, dtype):
        if dtype.is_float and dtype.itemsize == 8:
            raise UnsupportedError("the metal backend has no f64; convert to f32 first")
        return super().upload(data, dtype)


class MetalCpuEmulatorBackend(MetalBackend):
    """MetalBackend (the MSL kernels and the shared host logic) on the CPU emulator."""

    def __init__(self):
        KernelBackend.__init__(self, CpuMetalDriver())

    def features(self):
        return {"backend": "metal kernels on the CPU emulator (test-only)", "f16": True, "bf16": True, "f64": False}
