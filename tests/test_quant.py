"""GGUF block formats: dequantisation (numpy and pure Python) bit-exact against the
`gguf` package, quantisation against gguf.quants.quantize, quantised matmul."""
from array import array

import numpy as np
import pytest

import tallow
from tallow.dtypes import get_dtype
from tallow.errors import DTypeError, FormatError, ShapeError
from tallow.quant import (GGML_TYPES, QUANT_NAMES, dequantize_numpy, dequantize_python, dequantize_rows_numpy,
                          dequantize_rows_python, qmatmul_numpy, qmatmul_python, quantize_numpy)

gguf = pytest.importorskip("gguf")
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

GGUF_DECODES = [q for q in QUANT_NAMES if q != "q8_k"]  # the gguf package has no Q8_K decoder


def _type(q):
    return T[q.upper()]


def _blocks(q, n_blocks, seed, sane_scales=True):
    """Random blocks; with sane_scales the f16/f32 scale fields are finite, moderate values."""
    rng = np.random.default_rng(seed)
    d = get_dtype(q)
    raw = rng.integers(0, 256, size=(n_blocks, d.block_bytes), dtype=np.uint8)
    if sane_scales:
        f16 = lambda: rng.uniform(-2, 2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        for at in {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q2_k": [80, 82],
                   "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}.get(q, []):
            raw[:, at:at + 2] = f16()
    return raw


def _same_bits(a, b):
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    assert a.shape == b.shape
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b))
    assert np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


def test_dtypes_registered_with_gguf_geometry():
    for q in QUANT_NAMES:
        d = get_dtype(q)
        assert d.is_quantized and get_dtype(q.upper()) is d
        assert (d.block_size, d.block_bytes) == GGML_QUANT_SIZES[_type(q)]
    for tid, (name, bs, bb) in GGML_TYPES.items():
        assert T(tid).name == name and GGML_QUANT_SIZES[T(tid)] == (bs, bb)


@pytest.mark.parametrize("q", GGUF_DECODES)
@pytest.mark.parametrize("sane", [True, False], ids=["scales", "random-bytes"])
def test_dequantize_numpy_bit_exact(q, sane):
    raw = _blocks(q, 300, seed=len(q) + sane, sane_scales=sane)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, _type(q))
    _same_bits(dequantize_numpy(raw, q, ref.size), ref)


@pytest.mark.parametrize("q", GGUF_DECODES)
def test_dequantize_python_bit_exact(q):
    raw = _blocks(q, 40, seed=7, sane_scales=False)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, _type(q))
    out = dequantize_python(raw.tobytes(), q, ref.size)
    assert isinstance(out, array) and out.typecode == "f"
    _same_bits(out, ref)


def test_q8_k_against_its_definition():
    # block_q8_K: float d; int8 qs[256]; int16 bsums[16]; value = d * q
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, size=(5, 292), dtype=np.uint8)
    raw[:, :4] = rng.uniform(-1, 1, 5).astype(np.float32).view(np.uint8).reshape(5, 4)
    ref = raw[:, :4].copy().view(np.float32) * raw[:, 4:260].view(np.int8).astype(np.float32)
    _same_bits(dequantize_numpy(raw, "q8_k", 5 * 256), ref)
    _same_bits(dequantize_python(raw.tobytes(), "q8_k", 5 * 256), ref)


@pytest.mark.parametrize("q", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_quantize_bit_exact_with_gguf(q):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[0] = 0  # all-zero blocks
    x[1, :32] = np.arange(32, dtype=np.float32) / 4 - 4  # exact ties
    x[2, :32] = 3.0  # constant block
    x[3] *= 1e-6
    ref = gguf.quants.quantize(x, _type(q))
    assert np.array_equal(quantize_numpy(x, q).reshape(ref.shape), ref)


def test_q4_k_quantisation_quality_and_format():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    x[0] = 0
    x[1] = np.abs(x[1])  # all-positive blocks take the min = 0 path
    blocks = quantize_numpy(x, "q4_k")
    ours = dequantize_numpy(blocks, "q4_k", x.size)
    theirs = gguf.quants.dequantize(blocks.reshape(32, -1), T.Q4_K).reshape(-1)
    _same_bits(ours, theirs)  # our blocks are valid Q4_K for the gguf package
    rel = lambda d: float(np.sqrt(np.mean((d - x.reshape(-1)) ** 2) / np.mean(x ** 2)))
    q4_1 = dequantize_numpy(quantize_numpy(x, "q4_1"), "q4_1", x.size)
    assert rel(ours) < 0.08  # measured 0.072 on Gaussian data
    assert rel(ours) < rel(q4_1)  # the least-squares search beats plain min/max at similar size
    assert np.all(ours[:512] == 0)


@pytest.mark.parametrize("q", ["q8_0", "q4_1", "q4_k", "q6_k"])
def test_dequantize_rows(q):
    d = get_dtype(q)
    k, n = 2 * d.block_size, 9
    raw = _blocks(q, n * 2, seed=1)
    full = dequantize_numpy(raw, q, n * k).reshape(n, k)
    ids = [3, 0, 8, 3]
    _same_bits(dequantize_rows_numpy(raw, q, k, np.array(ids)), full[ids])
    _same_bits(dequantize_rows_python(raw.tobytes(), q, k, ids), full[ids])
    with pytest.raises(FormatError, match="out of range"):
        dequantize_rows_numpy(raw, q, k, [n])
    with pytest.raises(FormatError, match="out of range"):
        dequantize_rows_python(raw.tobytes(), q, k, [-1])


@pytest.mark.parametrize("q", ["q8_0", "q4_0", "q4_1", "q5_1", "q4_k", "q6_k"])
def test_qmatmul_matches_dequantised_matmul(q):
    d = get_dtype(q)
    rng = np.random.default_rng(2)
    n, k = 24, 2 * max(d.block_size, 64)
    raw = _blocks(q, n * k // d.block_size, seed=4)
    w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    tol = 1e-5 * np.abs(x).max() * np.abs(w).max() * k
    assert np.abs(qmatmul_numpy(x, raw, q, n, k) - ref).max() < tol
    out = qmatmul_python(array("f", x.tobytes()), raw.tobytes(), q, n, k)
    assert np.abs(np.frombuffer(out, np.float32).reshape(2, 3, n) - ref).max() < tol


def test_qmatmul_chunking_covers_every_row(monkeypatch):
    import tallow.quant.matmul as m
    monkeypatch.setattr(m, "CHUNK_ELEMENTS", 64 * 3)  # 3 rows per chunk, 10 rows: a ragged last chunk
    raw = _blocks("q8_0", 20, seed=9)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    w = dequantize_numpy(raw, "q8_0", 640).reshape(10, 64)
    np.testing.assert_allclose(m.qmatmul_numpy(x, raw, "q8_0", 10, 64), x @ w.T, rtol=1e-5, atol=1e-5)


def test_bad_input_errors():
    raw = _blocks("q4_0", 2, seed=0)
    with pytest.raises(FormatError, match="need 36 bytes"):
        dequantize_numpy(raw[:1], "q4_0", 64)
    with pytest.raises(FormatError, match="need 36 bytes"):
        dequantize_python(raw.tobytes()[:-1], "q4_0", 64)
    with pytest.raises(FormatError, match="whole number"):
        dequantize_numpy(raw, "q4_0", 63)
    with pytest.raises(DTypeError, match="not a quantised"):
        dequantize_numpy(raw, "f32", 64)
    with pytest.raises(DTypeError, match="not implemented"):
        quantize_numpy(np.zeros(256, np.float32), "q6_k")
    with pytest.raises(ShapeError):
        qmatmul_numpy(np.zeros((1, 32), np.float32), raw, "q4_0", 1, 64)


@pytest.mark.parametrize("dev", ["cpu", "python"])
def test_through_tensors(dev):
    rng = np.random.default_rng(8)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    wq = tallow.from_numpy(w).to(get_dtype("q8_0")).to(dev)
    assert wq.dtype is get_dtype("q8_0") and wq.shape == (6, 64)
    deq = dequantize_numpy(quantize_numpy(w, "q8_0"), "q8_0", w.size).reshape(6, 64)
    got = (tallow.from_numpy(x).to(dev) @ wq.T).numpy()
    # A backend may quantise x to 8 bits per 32 values as ggml does (the CPU's numba kernels):
    # each value then moves by at most half a step, amax/127/2, so the dot by at most that
    # times the sum of |w| over the block.
    step = np.abs(x.reshape(3, 2, 32)).max(axis=2) / 127
    bound = (step / 2) @ np.abs(deq).reshape(6, 2, 32).sum(axis=2).T
    assert np.all(np.abs(got - x @ deq.T) <= bound + 1e-5 * (np.abs(x) @ np.abs(deq).T) + 1e-5)
    _same_bits(wq.to(tallow.f32).numpy(), deq)


def test_numpy_joins_adjacent_mapped_rows_without_a_copy():
    """q/k/v and gate/up are joined at load time; on the CPU, parts side by side in the mapped
    GGUF (ffn_gate, ffn_up) must join as a view of the mapping, others as a copy."""
    import mmap
    import tempfile

    from tallow.backends.cpu.backend import NumpyBackend
    from tallow.layout import Layout

    be, q = NumpyBackend(), get_dtype("q8_0")
    raw = np.random.default_rng(0).integers(0, 256, size=3 * 4 * q.block_bytes, dtype=np.uint8)
    with tempfile.TemporaryFile() as f:
        f.write(raw.tobytes())
        f.flush()
        mapped = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        part = 4 * q.block_bytes
        a, b, c = (be.from_bytes(mapped[i * part:(i + 1) * part], q) for i in range(3))
        lay = Layout((4, 32))
        side_by_side = be.concat_rows([(a, lay), (b, lay)], q)
        assert np.shares_memory(side_by_side, a) and np.shares_memory(side_by_side, b)
        np.testing.assert_array_equal(side_by_side, raw[:2 * part])
        apart = be.concat_rows([(a, lay), (c, lay)], q)
        assert not np.shares_memory(apart, a)
        np.testing.assert_array_equal(apart, np.concatenate([raw[:part], raw[2 * part:]]))
