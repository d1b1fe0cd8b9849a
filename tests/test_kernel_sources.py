"""The GPU kernel sources compile, and every kernel the host launches exists in them.

CUDA: each kernels/*.cu file goes through `nvcc -ptx` for sm_87 (Jetson Orin) and sm_90
(Hopper), one translation unit per file, with warnings shown. Metal: each
kernels/*.metal file (with common.metal) is checked as C++17 by g++ against
metal_backend/msl_shim.h, which stands in for Metal's qualifiers, types and library
(what that does and does not catch: see the header). No GPU is needed for either.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess

import pytest

from tallow_cuda import driver as cuda_driver
from tallow.backends.kernel.host import kernel_inventory
from tallow_metal import backend as metal_backend
from tallow_metal import driver as metal_driver

CUDA_DIR = cuda_driver.KERNEL_DIR
METAL_DIR = metal_driver.KERNEL_DIR
SHIM = os.path.join(os.path.dirname(METAL_DIR), "msl_shim.h")
CUDA_FILES = sorted(f[:-3] for f in os.listdir(CUDA_DIR) if f.endswith(".cu"))
METAL_FILES = sorted(f[:-6] for f in os.listdir(METAL_DIR) if f.endswith(".metal") and f != "common.metal")
ARCHS = ("sm_87", "sm_90")


def _nvcc():
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """{(arch, file): (returncode, stderr, ptx text)}: all compiled once, two at a time."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed here: the CUDA kernel sources cannot be compiled")
    out = tmp_path_factory.mktemp("ptx")

    def compile_one(job):
        arch, name = job
        target = out / f"{name}.{arch}.ptx"
        proc = subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-std=c++17", "-o", str(target),
                               os.path.join(CUDA_DIR, name + ".cu")], capture_output=True, text=True, timeout=300)
        return job, (proc.returncode, proc.stderr, target.read_text() if proc.returncode == 0 else "")

    jobs = [(arch, name) for arch in ARCHS for name in CUDA_FILES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(compile_one, jobs))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", CUDA_FILES)
def test_cuda_kernel_file_compiles(ptx, arch, name):
    rc, err, _ = ptx[(arch, name)]
    assert rc == 0, f"nvcc -ptx -arch={arch} {name}.cu failed:\n{err}"
    assert "warning" not in err.lower(), f"{name}.cu compiles with warnings for {arch}:\n{err}"


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_kernels_cover_every_launch(ptx, arch):
    for module, names in kernel_inventory(has_f64=True, atomic64=True).items():
        rc, err, text = ptx[(arch, module)]
        assert rc == 0, err
        entries = set(re.findall(r"\.entry\s+(\w+)\(", text))
        missing = sorted(set(names) - entries)
        assert not missing, f"{module}.cu lacks kernels the host launches: {missing[:10]}"


def test_cuda_source_inlines_common_header():
    src = cuda_driver.kernel_source("reduce")
    assert '#include "common.cuh"' not in src and "strided_offset" in src and "softmax_impl" in src


# ---- Metal ----------------------------------------------------------------------------------
def _gxx():
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed here: the MSL sources cannot be syntax-checked")
    return gxx


def _gxx_args(name):
    return ["-std=c++17", "-Wall", "-Werror", "-x", "c++", "-include", SHIM,
            "-include", os.path.join(METAL_DIR, "common.metal"), os.path.join(METAL_DIR, name + ".metal")]


@pytest.mark.parametrize("name", METAL_FILES)
def test_metal_kernel_file_is_valid_cxx(name):
    proc = subprocess.run([_gxx(), "-fsyntax-only"] + _gxx_args(name), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{name}.metal does not compile as C++ against msl_shim.h:\n{proc.stderr}"


def test_metal_kernels_cover_every_launch():
    gxx = _gxx()
    inventory = kernel_inventory(has_f64=False, atomic64=False, matmul_dtypes=metal_backend.MATMUL_DTYPES)
    assert set(inventory) == set(METAL_FILES)
    for module, names in inventory.items():
        proc = subprocess.run([gxx, "-E"] + _gxx_args(module), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        defined = set(re.findall(r'extern "C"\s+void\s+(\w+)\s*\(', proc.stdout))
        missing = sorted(set(names) - defined)
        assert not missing, f"{module}.metal lacks kernels the host launches: {missing[:10]}"


def test_metal_and_cuda_kernel_files_match():
    """The two kernel sets mirror each other file by file (one host drives both)."""
    assert set(METAL_FILES) - {"matmul"} == set(CUDA_FILES)


def test_shim_catches_errors(tmp_path):
    """The shim check is not vacuous: a type error and an unknown name in MSL fail it."""
    gxx = _gxx()
    for body in ("kernel void k(device float* x [[buffer(0)]]) { x = 1.0f; }",
                 "kernel void k(device float* x [[buffer(0)]]) { x[0] = no_such_function(x[0]); }"):
        bad = tmp_path / "bad.metal"
        bad.write_text(body)
        proc = subprocess.run([gxx, "-fsyntax-only", "-std=c++17", "-x", "c++", "-include", SHIM,
                               "-include", os.path.join(METAL_DIR, "common.metal"), str(bad)], capture_output=True, text=True)
        assert proc.returncode != 0
