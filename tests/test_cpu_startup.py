"""What loading the CPU kernels costs a fresh process: numba's import of scipy's BLAS is
avoided (core/quant/numba_setup.py), without taking BLAS away from other numba code."""
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
from tallow.quant import cpu_matmul, quantize_numpy
assert cpu_matmul.kernels() is not None
w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
raw = quantize_numpy(w, "q4_1")
cpu_matmul.dequant_rows(raw, "q4_1", 64, np.array([1, 3]))
cpu_matmul.qmatmul(np.ones((1, 64), np.float32), raw, "q4_1", 8, 64)
cpu_matmul.qmatmul(np.ones((cpu_matmul.FUSED_MAX_ROWS + 1, 64), np.float32), raw, "q4_1", 8, 64)
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
