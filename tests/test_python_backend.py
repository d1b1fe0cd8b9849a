"""The pure-Python backend beyond the contract suite (tests/conformance/test_primitives.py runs
every primitive on it, and on every other device): its own code paths (both dot products),
what it does beyond the contract (broadcasting operands itself, index checks of its own,
quantised row picks from narrowed views), and that it runs without numpy (Pyodide).
"""
import math
import subprocess
import sys

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.operand import Operand
from tallow.backends.python_backend import PythonBackend
from tallow.backends.specs import ConvSpec
from tallow.errors import ShapeError
from tallow.layout import Layout

torch = pytest.importorskip("torch")
F = torch.nn.functional

B = PythonBackend()
RNG = np.random.default_rng(1234)


def place(arr, dtype, layout_kind="contiguous"):
    """Storage and a layout whose elements read back as arr (contiguous, or transposed)."""
    arr = np.asarray(arr)
    if layout_kind == "transposed" and arr.ndim >= 2:
        rev = list(range(arr.ndim))[::-1]
        stored = np.ascontiguousarray(arr.transpose(rev))
        return B.from_list(stored.ravel().tolist(), dtype), Layout(stored.shape).permute(rev)
    if layout_kind == "strided":
        holder = np.zeros(arr.shape[:-1] + (arr.shape[-1] * 2 + 1,), dtype=arr.dtype)
        holder[..., 1::2][..., :arr.shape[-1]] = arr
        strides = list(Layout(holder.shape).strides)
        strides[-1] = 2
        return B.from_list(holder.ravel().tolist(), dtype), Layout(arr.shape, strides, 1)
    return B.from_list(arr.ravel().tolist(), dtype), Layout(arr.shape)


def result(storage, shape, dtype=D.f32):
    return np.array(B.to_list(storage, Layout(shape), dtype), dtype=np.float64).reshape(shape)


def close(got, ref):
    np.testing.assert_allclose(got, np.asarray(ref, np.float64), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("fast_dot", ["sumprod", "sum_map"])
def test_both_dot_paths(monkeypatch, fast_dot):
    # math.sumprod exists from Python 3.12 (Pyodide has it); exercise both code paths here.
    from tallow.backends import python_linalg
    monkeypatch.setattr(python_linalg, "_sumprod", (lambda x, y: math.fsum(map(float.__mul__, x, y)))
                        if fast_dot == "sumprod" else None)
    a = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    b = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    close(result(B.matmul(Operand(*place(a, D.f32, "strided")), Operand(*place(b, D.f32, "transposed")), D.f32), (2, 3, 4)), a @ b)
    x = RNG.standard_normal((1, 2, 9)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 2)).astype(np.float32)
    ref = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), None, 2, 1).numpy()
    close(result(B.conv1d(Operand(*place(x, D.f32)), Operand(*place(w, D.f32)), D.f32, ConvSpec(2, 1, 1, 1)), ref.shape), ref)


# ---- beyond the contract: the front end never asks for these, the pure-Python backend allows them ----
def test_matmul_broadcasts_batch_dims_itself():
    a = RNG.standard_normal((2, 1, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((5, 4, 2)).astype(np.float32)
    close(result(B.matmul(Operand(*place(a, D.f32)), Operand(*place(b, D.f32, "transposed")), D.f32), (2, 5, 3, 2)), np.matmul(a, b))


def test_where_broadcasts_itself():
    c = np.array([[True], [False]])
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    got = B.where(Operand(*place(c, D.bool_)), Operand(*place(a, D.f32)), Operand(*place(np.float32(5.0), D.f32)), D.f32)
    close(result(got, (2, 3)), np.where(c, a, np.float32(5)))


def test_index_select_checks_ids_itself():
    # The front end checks ids for every backend (core/index_check.py); this backend also refuses them.
    st, lay = place(RNG.standard_normal((4, 5)).astype(np.float32), D.f32)
    for dim in (0, 1):
        with pytest.raises(ShapeError, match="out of range"):
            B.index_select(Operand(st, lay), Operand(*place(np.array([0, 9]), D.i64)), D.f32, dim)
    ids = np.array([2, 0, -1, 2])  # Python-style negative ids wrap here
    np.testing.assert_array_equal(result(B.index_select(Operand(st, lay), Operand(*place(ids, D.i64)), D.f32, 0), (4, 5)),
                                  np.array(B.to_list(st, lay, D.f32)).reshape(4, 5)[ids])


@pytest.mark.parametrize("qname", ["q4_0", "q4_1", "q8_0"])
def test_quantised_rows_of_a_narrowed_view(qname):
    # The front end refuses strided views of quantised tensors (UnsupportedError); this backend reads the offset.
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    from tallow.quant import quant_dtype
    qtype = getattr(gguf.GGMLQuantizationType, qname.upper())
    qd = quant_dtype(qname)
    n, k = 6, 64
    raw = quantize(RNG.standard_normal((n, k)).astype(np.float32), qtype).tobytes()
    ref_w = dequantize(np.frombuffer(raw, np.uint8).reshape(n, -1), qtype).reshape(n, k)
    # rows 2..5 of the matrix as a narrowed (offset) layout: its rows 1 and 3 are rows 3 and 5
    got = B.index_select(Operand(B.from_bytes(raw, qd), Layout((n, k)).narrow(0, 2, 4)),
                         Operand(*place(np.array([1, 3]), D.i64)), qd, 0)
    np.testing.assert_array_equal(result(got, (2, k)), ref_w[[3, 5]])


# ---- Pyodide constraint ---------------------------------------------------------------------------
def test_backend_imports_and_runs_without_numpy():
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from tallow.backends.python_backend import PythonBackend\n"
        "from tallow.backends.operand import Operand\n"
        "from tallow.layout import Layout\nfrom tallow import dtypes as D\n"
        "b = PythonBackend(); s = b.from_list([1.0, 2.0, 3.0, 4.0], D.f32)\n"
        "out = b.matmul(Operand(s, Layout((2, 2))), Operand(s, Layout((2, 2)).permute((1, 0))), D.f32)\n"
        "print(b.to_list(out, Layout((4,)), D.f32))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[5.0, 11.0, 11.0, 25.0]"
