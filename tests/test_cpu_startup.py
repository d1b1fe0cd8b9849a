"""What loading the CPU kernels costs a fresh process: numba's import of scipy's BLAS is
avoided (core/backends/cpu/kernels/numba_setup.py), without taking BLAS away from other numba code."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")
pytest.importorskip("scipy")

# Every kind of kernel a quantised decoder runs: embedding rows, a decoding-step product,
# a prompt (tiled) product, the fused decode ops.
RUN_KERNELS = """
import sys, numpy as np
import tallow
from tallow import functional as F
from tallow.backends.cpu.runtime import kernel_calls
from tallow.quant import quantize_numpy
assert kernel_calls.kernels() is not None
w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
raw = quantize_numpy(w, "q4_1")
kernel_calls.dequant_rows(raw, "q4_1", 64, np.array([1, 3]))
kernel_calls.qmatmul(np.ones((1, 64), np.float32), raw, "q4_1", 8, 64)
kernel_calls.qmatmul(np.ones((kernel_calls.FUSED_MAX_ROWS + 1, 64), np.float32), raw, "q4_1", 8, 64)
x = tallow.ones(1, 8)
F.add_rms_norm(x, x, tallow.ones(8))
"""


def _run(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def test_running_the_kernels_does_not_import_scipy_blas():
    code = RUN_KERNELS + "print(sorted(m for m in ('scipy.linalg', 'scipy.linalg.cython_blas') if m in sys.modules))"
    assert _run(code)[-1] == "[]"


def test_numba_code_compiled_afterwards_still_gets_blas():
    """The block lasts one import: a user's njit np.dot, compiled after the kernels ran, imports
    scipy's BLAS itself and gives numpy's answer."""
    code = RUN_KERNELS + (
        "from numba import njit\n"
        "dot = njit(lambda a, b: np.dot(a, b))\n"
        "a = np.arange(12, dtype=np.float64).reshape(3, 4)\n"
        "print(np.array_equal(dot(a, a.T), a @ a.T), 'scipy.linalg.cython_blas' in sys.modules)\n")
    assert _run(code)[-1] == "True True"


def test_scipy_blas_imported_first_is_left_alone():
    code = "import scipy.linalg.cython_blas\n" + RUN_KERNELS + (
        "import numba.np.arraymath\nprint(numba.np.arraymath._HAVE_BLAS)\n")
    assert _run(code)[-1] == "True"


LLVM_RESIDENT = """
import re
def llvm_resident_kb():
    kb, mine = 0, False
    for line in open('/proc/self/smaps'):
        if re.match(r'^[0-9a-f]+-[0-9a-f]+ ', line):
            mine = 'libllvmlite' in line
        elif mine and line.startswith('Rss:'):
            kb += int(line.split()[1])
    return kb
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_llvm_pages_are_handed_back_after_the_kernels_load():
    """Numba's import and the first kernel load make ~68 MB of libllvmlite resident; after the
    loads, only its writable pages (~1 MB) stay. The kernels still run afterwards."""
    code = LLVM_RESIDENT + RUN_KERNELS + (
        "after = llvm_resident_kb()\n"
        "y = kernel_calls.qmatmul(np.ones((1, 64), np.float32), raw, 'q4_1', 8, 64)\n"
        "ref = np.ones((1, 64), np.float32) @ tallow.quant.dequantize_numpy(raw, 'q4_1', 512).reshape(8, 64).T\n"
        "print(after, np.allclose(y, ref, rtol=1e-3, atol=1e-3))\n")
    after, close = _run(code)[-1].split()
    assert int(after) < 8 * 1024 and close == "True"


def test_clean_ranges_skip_writable_and_dirty_mappings():
    from tallow.backends.cpu.kernels.llvm_pages import clean_ranges
    smaps = "\n".join([
        "7f0000000000-7f0000100000 r--p 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so",
        "Rss:                 400 kB", "Private_Dirty:         0 kB", "Shared_Dirty:          0 kB",
        "VmFlags: rd mr mw me",
        "7f0000100000-7f0000900000 r-xp 00100000 08:01 11 /venv/llvmlite/binding/libllvmlite.so",
        "Private_Dirty:         0 kB", "Shared_Dirty:          0 kB",
        "7f0000900000-7f0000a00000 r--p 00900000 08:01 11 /venv/llvmlite/binding/libllvmlite.so",
        "Private_Dirty:        12 kB", "Shared_Dirty:          0 kB",  # relocated then made read-only (RELRO)
        "7f0000a00000-7f0000b00000 rw-p 00a00000 08:01 11 /venv/llvmlite/binding/libllvmlite.so",
        "Private_Dirty:         0 kB",
        "7f0000b00000-7f0000c00000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6",
        "Private_Dirty:         0 kB",
        "7f0000c00000-7f0000c10000 r-xp 00000000 08:01 13 /conda/lib/libLLVM-15.so",
        "Private_Dirty:         0 kB",
        "7f0000d00000-7f0000e00000 r--p 00000000 00:00 0",
        "Private_Dirty:         0 kB",
    ])
    assert clean_ranges(smaps) == [(0x7f0000000000, 0x7f0000100000), (0x7f0000100000, 0x7f0000900000),
                                   (0x7f0000c00000, 0x7f0000c10000)]
