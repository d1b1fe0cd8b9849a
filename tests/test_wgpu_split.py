"""Tensors larger than one storage binding, on the wgpu backend (lavapipe in CI).

The binding limit is lowered to 64 KiB (and the offset alignment raised to the
browsers' 256 bytes) so that small weights are split into pieces: quantised
matvec/matmul and embedding lookups by row ranges, f32 matmul weights by
column ranges. Results are checked against gguf's own dequantisation and
numpy; a tiny synthetic Phi-2 / Phi-3 GGUF gives the same logits on wgpu, with
$TALLOW_WGPU_MAX_BINDING_MB lowered, as on numpy.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.operand import Operand, QuantWeight
from tallow.errors import DeviceError, Error, UnsupportedError
from tallow.layout import Layout

from storage_io import down, up

try:
    from tallow_wgpu import split
    from tallow_wgpu.backend import WgpuBackend
    _BACKEND = WgpuBackend(max_binding=64 * 1024)
    _BACKEND.limits["storage_align"] = 256  # what browsers ask for (lavapipe: 32)
    _REASON = None
except DeviceError as e:
    _BACKEND, _REASON = None, str(e)

pytestmark = pytest.mark.skipif(_BACKEND is None, reason=f"no wgpu adapter: {_REASON}")
LIMIT = 64 * 1024
RNG = np.random.default_rng(7)
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def be():
    """The backend with its driver's dispatches recorded: (binding offsets, sizes) per dispatch."""
    calls = []
    driver = _BACKEND.driver
    real = driver.dispatch

    def spy(pipeline, buffers, params, workgroups):
        calls.append([(off, size) for _, off, size in buffers])
        return real(pipeline, buffers, params, workgroups)

    driver.dispatch = spy
    _BACKEND.calls = calls
    yield _BACKEND
    driver.dispatch = real


def _split_happened(be):
    """Some dispatch bound a piece of a buffer (a non-zero offset), and none exceeded the limit."""
    bindings = [b for call in be.calls for b in call]
    assert all(size <= LIMIT for _, size in bindings)
    return any(off > 0 for off, _ in bindings)


def _quantized(qname, n, k):
    gq = pytest.importorskip("gguf.quants")
    import gguf
    qt = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
          "q4_1": gguf.GGMLQuantizationType.Q4_1}[qname]
    w = RNG.standard_normal((n, k)).astype(np.float32)
    blocks = gq.quantize(w, qt)
    return blocks, gq.dequantize(blocks, qt).astype(np.float64)


@pytest.mark.parametrize("qname,n,k", [("q8_0", 300, 256), ("q4_0", 617, 224), ("q4_1", 900, 160)])
def test_quantized_matmul_and_embedding_split_by_rows(be, monkeypatch, qname, n, k):
    import tallow.quant  # noqa: F401  (registers the block dtypes)
    import tallow_wgpu.matmul as matmul_module
    qdt = D.get_dtype(qname)
    blocks, w_ref = _quantized(qname, n, k)
    assert blocks.nbytes > LIMIT
    sw = be.from_bytes(blocks.tobytes(), qdt)
    for m, matvec_rows in ((1, 64), (3, 64), (3, 1)):  # qmatvec (decoding, short prompts), then qmatmul
        monkeypatch.setattr(matmul_module, "QMATVEC_MAX_ROWS", matvec_rows)
        be.calls.clear()
        x = RNG.standard_normal((m, k)).astype(np.float32)
        got = down(be, be.qmatmul(Operand(up(be, x, D.f32), Layout((m, k))), QuantWeight(sw, qdt, n, k), D.f32), (m, n))
        bound = np.abs(x) @ np.abs(w_ref).T
        assert np.all(np.abs(got - x @ w_ref.T) <= 3e-5 * bound + 1e-6), m
        assert _split_happened(be)
    be.calls.clear()
    ids = np.array([n - 1, 0, n // 2, 5, n - 1, -1], np.int64)
    rows = be.index_select(Operand(sw, Layout((n, k))), Operand(up(be, ids, D.i64), Layout((len(ids),))), qdt, 0)
    np.testing.assert_array_equal(down(be, rows, (len(ids), k)), w_ref[ids].astype(np.float32))
    assert _split_happened(be)


@pytest.mark.parametrize("m,k", [(1, 128), (5, 128), (4, 130)])  # matvec_rows, matmul_rows, plain matmul
def test_f32_linear_weight_split_by_columns(be, m, k):
    n = 200
    w = RNG.standard_normal((n, k)).astype(np.float32)  # a Linear weight: x . w^T
    x = RNG.standard_normal((m, k)).astype(np.float32)
    assert w.nbytes > LIMIT
    be.calls.clear()
    got = down(be, be.matmul(Operand(up(be, x, D.f32), Layout((m, k))), Operand(up(be, w, D.f32), Layout((k, n), (1, k))), D.f32),
               (m, n))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)
    assert _split_happened(be)


def test_unsplittable_operand_is_refused_by_name(be):
    k, n = 160, 128  # a row-major (k, n) right operand: its columns are interleaved, not pieces of rows
    b = RNG.standard_normal((k, n)).astype(np.float32)
    with pytest.raises(UnsupportedError, match="columns are not stored apart"):
        be.matmul(Operand(up(be, np.ones((2, k)), D.f32), Layout((2, k))), Operand(up(be, b, D.f32), Layout((k, n))), D.f32)
    big = up(be, np.ones(LIMIT // 4 + 64), D.f32)  # element-wise ops are not split: a clear refusal
    with pytest.raises(UnsupportedError, match="storage binding limit"):
        be.unary("exp", big, Layout((LIMIT // 4 + 64,)), D.f32)


def test_binding_limit_setting():
    assert split.binding_limit(1 << 27, 256, env={}) == 1 << 27
    assert split.binding_limit(1 << 27, 256, env={split.ENV: "0.0625"}) == 65536
    assert split.binding_limit(1 << 20, 256, env={split.ENV: "4096"}) == 1 << 20  # never above the adapter's
    assert split.binding_limit(1 << 27, 256, requested=70000, env={split.ENV: "1"}) == 69888  # aligned down
    for bad in ("abc", "0", "-1", "nan", "0.001"):
        with pytest.raises(Error, match=split.ENV):  # DeviceError for "0.001": below MIN_BINDING
            split.binding_limit(1 << 27, 256, env={split.ENV: bad})
    assert split.row_pieces(10, 100, 1 << 20, 256, "x") == [(0, 10)]
    pieces = split.row_pieces(1000, 102, 16384, 256, "x")  # 34 * 3-byte rows: aligned starts every 128 rows
    assert len(pieces) > 1 and pieces[0][0] == 0 and pieces[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert all(r0 * 102 % 256 == 0 and (r1 - r0) * 102 <= 16384 for r0, r1 in pieces)
    with pytest.raises(UnsupportedError, match="cannot be split"):
        split.row_pieces(1000, 102, 8192, 256, "embedding")


def _synthetic(tmp_path, arch):
    sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
    try:
        import make_synthetic_gguf as maker
    finally:
        sys.path.pop(0)
    path = tmp_path / f"{arch}.gguf"
    maker.write(path, arch, "q8_0", scale=1 / 8, layers=2, seed=3)
    return path


@pytest.mark.parametrize("arch", ["phi2", "phi3"])
def test_tiny_synthetic_phi_logits_on_split_wgpu_equal_numpy(tmp_path, arch):
    """The whole model on wgpu with 384 KiB bindings, in a fresh process so that
    $TALLOW_WGPU_MAX_BINDING_MB is what sets the limit: the embedding, the output head and the
    feed-forward weights (and Phi-3's fused qkv) are split; the KV cache (4 heads x 256 positions)
    still fits one binding."""
    path = _synthetic(tmp_path, arch)
    code = (
        "import json, sys, numpy as np, tallow\n"
        "from tallow.models.loader import load_gguf\n"
        "import tallow_wgpu.split as split\n"
        "pieces, row_pieces = [], split.row_pieces\n"
        "split.row_pieces = lambda *a: pieces.append(row_pieces(*a)) or pieces[-1]\n"
        "ids = [5, 17, 300, 2]\n"
        "out = {}\n"
        "for dev in ('cpu', 'wgpu'):\n"
        "    m = load_gguf(sys.argv[1], device=dev)\n"
        "    out[dev] = m(ids).numpy()[0].tolist()\n"
        "be = tallow.Device('wgpu').backend\n"
        "out['limit'] = be.limits['max_storage_binding']\n"
        "out['split_calls'] = sum(len(p) > 1 for p in pieces)\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, split.ENV: "0.375"}
    run = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["limit"] == 384 * 1024 and out["split_calls"] > 0
    cpu, gpu = np.array(out["cpu"]), np.array(out["wgpu"])
    assert cpu.shape[0] == 4 and np.abs(cpu).max() > 0.1
    np.testing.assert_allclose(gpu, cpu, rtol=0, atol=1e-4 * np.abs(cpu).max())
