"""The GPU kernel sources compile, every kernel the host launches exists in them, and the
CUDA C and MSL kernel sets are one set.

The kernels are written once (tallow/backends/gpu_kernels/: a dialect spelled out by cuda.h
and msl.h); each backend's driver assembles a module's source (kernel_source), and that text
is what is checked here. CUDA: `nvcc -ptx` for sm_87 (Jetson Orin) and sm_90 (Hopper), one
translation unit per module, with warnings shown. Metal: each module is checked as C++17 by
g++ against metal_backend/msl_shim.h, which stands in for Metal's qualifiers, types and
library (what that does and does not catch: see the header). No GPU is needed for either.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess

import pytest

from tallow.backends import gpu_kernels
from tallow_cuda import driver as cuda_driver
from tallow.backends.kernel import emulator
from tallow.backends.kernel.host import kernel_inventory
from tallow_cuda.cpu_driver import kernel_params
from tallow_metal import backend as metal_backend
from tallow_metal import driver as metal_driver
from tallow_metal.cpu_driver import kernel_signatures

CUDA_SHIM = os.path.join(os.path.dirname(cuda_driver.__file__), "cuda_cpu_shim.h")
MSL_SHIM = os.path.join(os.path.dirname(metal_driver.__file__), "msl_shim.h")
CUDA_MODULES = sorted(gpu_kernels.MODULES + cuda_driver.OWN_MODULES)
METAL_MODULES = sorted(gpu_kernels.MODULES + metal_driver.OWN_MODULES)
ARCHS = ("sm_87", "sm_90")


def _nvcc():
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


def _gxx():
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed here: the kernel sources cannot be checked as C++")
    return gxx


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{(language, module): path of its assembled source}, as the drivers build it."""
    out = tmp_path_factory.mktemp("kernel-sources")
    paths = {}
    for language, driver, modules, suffix in (("cuda", cuda_driver, CUDA_MODULES, ".cu"),
                                              ("msl", metal_driver, METAL_MODULES, ".metal")):
        for module in modules:
            path = out / (module + suffix)
            path.write_text(driver.kernel_source(module))
            paths[(language, module)] = str(path)
    return paths


def _preprocessed(path, language):
    """The source after the C preprocessor, as the CPU emulator sees it (MSL attributes kept)."""
    args = (["-include", CUDA_SHIM] if language == "cuda"
            else ["-DTALLOW_MSL_KEEP_ATTRIBUTES", "-include", MSL_SHIM])
    # -I: the shims include the fiber scheduler beside the shared kernel backend.
    proc = subprocess.run([_gxx(), "-E", "-std=c++17", "-x", "c++", "-I", emulator.HERE] + args + [path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def kernel_names(sources):
    """{(language, module): set of kernel names defined}."""
    jobs = list(sources.items())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        texts = list(pool.map(lambda job: _preprocessed(job[1], job[0][0]), jobs))
    return {key: set(re.findall(r'extern "C"\s+void\s+(\w+)\s*\(', text)) for (key, _), text in zip(jobs, texts)}


# ---- CUDA ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx(sources, tmp_path_factory):
    """{(arch, module): (returncode, stderr, ptx text)}: all compiled once, two at a time."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed here: the CUDA kernel sources cannot be compiled")
    out = tmp_path_factory.mktemp("ptx")

    def compile_one(job):
        arch, name = job
        target = out / f"{name}.{arch}.ptx"
        proc = subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-std=c++17", "-o", str(target),
                               sources[("cuda", name)]], capture_output=True, text=True, timeout=300)
        return job, (proc.returncode, proc.stderr, target.read_text() if proc.returncode == 0 else "")

    jobs = [(arch, name) for arch in ARCHS for name in CUDA_MODULES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(compile_one, jobs))


@pytest.mark.slow  # nvcc -ptx of every module for two archs
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", CUDA_MODULES)
def test_cuda_kernel_module_compiles(ptx, arch, name):
    rc, err, _ = ptx[(arch, name)]
    assert rc == 0, f"nvcc -ptx -arch={arch} on {name}'s CUDA source failed:\n{err}"
    assert "warning" not in err.lower(), f"{name}'s CUDA source compiles with warnings for {arch}:\n{err}"


@pytest.mark.slow  # needs the same PTX
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_kernels_cover_every_launch(ptx, arch):
    for module, names in kernel_inventory(has_f64=True, atomic64=True).items():
        rc, err, text = ptx[(arch, module)]
        assert rc == 0, err
        entries = set(re.findall(r"\.entry\s+(\w+)\(", text))
        missing = sorted(set(names) - entries)
        assert not missing, f"{module} lacks CUDA kernels the host launches: {missing[:10]}"


def test_cuda_source_is_self_contained():
    """NVRTC gets no include path: the dialect header and common.h are inlined, and compiler
    messages name the shared files (#line)."""
    src = cuda_driver.kernel_source("reduce")
    assert '#include "' not in src
    assert src.index('#line 1 "cuda.h"') < src.index('#line 1 "common.h"') < src.index('#line 1 "reduce.kernels"')
    assert "strided_offset" in src and "softmax_impl" in src


# ---- Metal -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METAL_MODULES)
def test_metal_kernel_module_is_valid_cxx(sources, name):
    proc = subprocess.run([_gxx(), "-fsyntax-only", "-std=c++17", "-Wall", "-Werror", "-x", "c++", "-include", MSL_SHIM,
                           sources[("msl", name)]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{name}'s MSL source does not compile as C++ against msl_shim.h:\n{proc.stderr}"


def test_metal_kernels_cover_every_launch(kernel_names):
    inventory = kernel_inventory(has_f64=False, atomic64=False, matmul_dtypes=metal_backend.MATMUL_DTYPES)
    assert set(inventory) == set(METAL_MODULES)
    for module, names in inventory.items():
        missing = sorted(set(names) - kernel_names[("msl", module)])
        assert not missing, f"{module} lacks MSL kernels the host launches: {missing[:10]}"


def test_metal_buffer_indices_count_from_zero(sources):
    """Metal binds arguments by [[buffer(i)]]; CUDA by position. Every kernel's indices must
    be 0, 1, 2, ... in order, or Metal would read the wrong argument (CUDA would not notice)."""
    for name in METAL_MODULES:
        for kernel, params in kernel_signatures(_preprocessed(sources[("msl", name)], "msl")).items():
            indices = [int(m.group(1)) for _, attr in params for m in [re.match(r"buffer\((\d+)\)", attr)] if m]
            assert indices == list(range(len(indices))), f"{name}: {kernel} binds buffers {indices}"


def test_cuda_and_msl_kernel_arguments_agree(sources):
    """The shared kernels take the same arguments, in the same order, in both languages (so
    one host drives both): the same count, and the same kind (buffer pointer or scalar)."""
    for name in gpu_kernels.MODULES:
        cuda = kernel_params(_preprocessed(sources[("cuda", name)], "cuda"))
        msl = kernel_signatures(_preprocessed(sources[("msl", name)], "msl"))
        for kernel, params in msl.items():
            msl_kinds = ["pointer" if t.endswith("*") else "scalar" for t, attr in params if attr.startswith("buffer")]
            cuda_kinds = ["pointer" if t.endswith("*") else "scalar" for t in cuda[kernel]]
            assert msl_kinds == cuda_kinds, f"{name}: {kernel} takes {cuda_kinds} in CUDA, {msl_kinds} in MSL"


# ---- one source for both languages --------------------------------------------------------------
def _needs_what_metal_lacks(kernel):
    """CUDA-only by capability: an f64 dtype (Metal has no double) or a 64-bit atomic add."""
    return "f64" in kernel.split("_") or kernel == "scatter_add_i64"


def test_a_kernel_in_only_one_language_is_listed_as_language_specific(kernel_names):
    """The shared modules define the same kernels in CUDA C and MSL, except those CUDA has only
    because Metal lacks f64 and 64-bit atomics. Any other kernel that exists in one language
    only lives in that backend's kernels/ folder and is listed in its driver's OWN_MODULES."""
    for module in gpu_kernels.MODULES:
        cuda, msl = kernel_names[("cuda", module)], kernel_names[("msl", module)]
        assert msl - cuda == set(), f"{module}: MSL-only kernels: {sorted(msl - cuda)[:10]}"
        unexplained = sorted(k for k in cuda - msl if not _needs_what_metal_lacks(k))
        assert not unexplained, f"{module}: CUDA-only kernels: {unexplained[:10]}"
        gated = sorted(k for k in msl if _needs_what_metal_lacks(k))
        assert not gated, f"{module}: MSL defines kernels Metal cannot run: {gated[:10]}"
    for driver, suffix in ((cuda_driver, ".cu"), (metal_driver, ".metal")):
        on_disk = set()
        if os.path.isdir(driver.KERNEL_DIR):
            on_disk = {f[:-len(suffix)] for f in os.listdir(driver.KERNEL_DIR) if f.endswith(suffix)}
            others = [f for f in os.listdir(driver.KERNEL_DIR) if not f.endswith(suffix)]
            assert not others, f"{driver.KERNEL_DIR}: files that are not {suffix} kernels: {others}"
        assert on_disk == set(driver.OWN_MODULES), (f"{driver.KERNEL_DIR} holds {sorted(on_disk)}; its driver lists "
                                                    f"{sorted(driver.OWN_MODULES)} as language-specific")
        assert not set(driver.OWN_MODULES) & set(gpu_kernels.MODULES)
    shared = {f[:-len(".kernels")] for f in os.listdir(gpu_kernels.DIR) if f.endswith(".kernels")}
    assert shared == set(gpu_kernels.MODULES)
    language_specific = {n for m in metal_driver.OWN_MODULES for n in kernel_names[("msl", m)]}
    language_specific |= {n for m in cuda_driver.OWN_MODULES for n in kernel_names[("cuda", m)]}
    for module in gpu_kernels.MODULES:
        assert not language_specific & kernel_names[("msl", module)] & kernel_names[("cuda", module)]


def test_the_two_dialect_headers_define_the_same_names():
    """cuda.h and msl.h spell out one dialect: each defines the macros and functions the other does."""
    def names(header):
        with open(os.path.join(gpu_kernels.DIR, header)) as f:
            text = f.read()
        macros = set(re.findall(r"^#define\s+(\w+)", text, re.M)) - {"TG_SHARED"}
        functions = set(re.findall(r"^DEVICE\s+\w+\s+(\w+)\(", text, re.M)) - {"erf_approx"}
        return macros | functions
    cuda, msl = names("cuda.h"), names("msl.h")
    assert cuda == msl, f"only in cuda.h: {sorted(cuda - msl)}; only in msl.h: {sorted(msl - cuda)}"


def test_shim_catches_errors(tmp_path):
    """The shim check is not vacuous: a type error and an unknown name in MSL fail it."""
    gxx = _gxx()
    for body in ("kernel void k(device float* x [[buffer(0)]]) { x = 1.0f; }",
                 "kernel void k(device float* x [[buffer(0)]]) { x[0] = no_such_function(x[0]); }",
                 "KERNEL(k, BUF(float, x, 0)) { x[0] = THREAD.no_such_field; }"):
        bad = tmp_path / "bad.kernels"
        bad.write_text(body)
        src = tmp_path / "bad.metal"
        src.write_text(gpu_kernels.source("msl", str(bad)))
        proc = subprocess.run([gxx, "-fsyntax-only", "-std=c++17", "-x", "c++", "-include", MSL_SHIM, str(src)],
                              capture_output=True, text=True)
        assert proc.returncode != 0
