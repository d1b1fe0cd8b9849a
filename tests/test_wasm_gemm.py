"""kernels.wasm's register-blocked GEMMs (tallow.backends.wasm.gemm_ir) under wasmtime against numpy
in float64: C = A . B^T (+ bias) with f32, f16 and GGUF-block weights, on shapes that are not
multiples of the 4x8 tile or the 128-row block, one row, strided A, B and C."""
import numpy as np
import pytest

from tallow.dtypes import get_dtype
from tallow.quant import dequantize_numpy

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
from tallow.backends.cpu.kernels import codes  # noqa: E402
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.program import gemm_scratch_floats  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)

from random_blocks import FORMATS, random_blocks  # noqa: E402

# (m, n, k): one row, tails of the 4x8 tile, blocks of 128 rows (k = 61) and of 16 rows (k = 640: the packed A
# tiles that fit the stack), then A read where it lies (k = 641, 2600)
SHAPES = [(1, 1, 1), (1, 9, 33), (5, 13, 7), (4, 8, 4), (7, 17, 64), (130, 37, 61), (37, 19, 640), (30, 19, 641),
          (9, 11, 2600)]


@pytest.fixture(scope="module")
def wasm():
    return Kernels(build.build())


def _bound(a, w):
    """float32 accumulation error allowed for each entry: relative to the sum of |products|."""
    return 2e-6 * np.sqrt(a.shape[1]) * (np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30


def _gemm(wasm, kernel, a, w, bias=None, lda=None, ldb=None, ldc=None):
    """Run gemm_f32/gemm_f16 with A, B placed in rows of lda/ldb elements (wider than k: strided
    views), C in rows of ldc; returns (C as (m, ldc), where C was placed)."""
    m, k = a.shape
    n = w.shape[0]
    lda, ldb, ldc = lda or k, ldb or k, ldc or n
    a_wide = np.full((m, lda), np.nan, np.float32)
    a_wide[:, :k] = a
    w_wide = np.full((n, ldb), np.nan, w.dtype)
    w_wide[:, :k] = w
    out = wasm.put(np.full((m, ldc), -7.0, np.float32))
    scratch = wasm.alloc(gemm_scratch_floats(k) * 4)
    wasm(kernel, wasm.put(a_wide), lda, wasm.put(w_wide), ldb, 0 if bias is None else wasm.put(bias), out, ldc,
         m, n, k, scratch)
    return wasm.get(out, (m, ldc), np.float32)


@pytest.mark.parametrize("kernel", ["gemm_f32", "gemm_f16"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_matches_numpy(wasm, kernel, m, n, k):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float16 if kernel == "gemm_f16" else np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    want = a.astype(np.float64) @ w.astype(np.float64).T
    got = _gemm(wasm, kernel, a, w)
    assert np.all(np.abs(got - want) <= _bound(a, w))
    got = _gemm(wasm, kernel, a, w, bias=bias)
    assert np.all(np.abs(got - (want + bias)) <= _bound(a, w) + 1e-6 * np.abs(bias))


@pytest.mark.parametrize("kernel", ["gemm_f32", "gemm_f16"])
def test_gemm_reads_strided_rows_and_writes_only_its_columns(wasm, kernel):
    """A and B as row views of wider matrices (their other columns NaN: never read), C into the
    first n columns of a wider one (the rest untouched)."""
    rng = np.random.default_rng(9)
    m, n, k = 9, 11, 21
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float16 if kernel == "gemm_f16" else np.float32)
    got = _gemm(wasm, kernel, a, w, lda=k + 5, ldb=k + 3, ldc=n + 4)
    assert np.all(np.abs(got[:, :n] - a.astype(np.float64) @ w.astype(np.float64).T) <= _bound(a, w))
    assert np.all(got[:, n:] == -7.0)


def test_gemm_f16_widens_every_weight_exactly(wasm):
    """Every f16 pattern but inf/NaN as a weight (subnormals, -0, the largest), times one-hot rows:
    each product is the weight itself (the one-hot sum makes -0 a +0: compared as values)."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    finite = bits[(bits & 0x7C00) != 0x7C00].view(np.float16)
    k = 64
    w = finite[: finite.size // k * k].reshape(-1, k)
    a = np.eye(k, dtype=np.float32)
    got = _gemm(wasm, "gemm_f16", a, w)
    assert np.array_equal(got, w.T.astype(np.float32))


@pytest.mark.parametrize("q", FORMATS)
def test_gemm_q_matches_dequantised_numpy(wasm, q):
    """The GGUF-block GEMM: each panel dequantised by the module's dequant_<fmt> (bit-exact with
    ggml) then the f32 micro-kernel; float activations, so only float32 rounding separates it
    from dequantise-then-numpy. Odd weight-row counts, a row remainder, rows of several blocks."""
    rng = np.random.default_rng(FORMATS.index(q) + 40)
    bs = get_dtype(q).block_size
    code = list(codes.FORMATS).index(q)
    for m, n, k in ((1, 3, bs), (6, 13, 2 * bs), (9, 8, 3 * bs)):
        raw = random_blocks(q, n * k // bs, rng)
        w = dequantize_numpy(raw, q, n * k).reshape(n, k).astype(np.float64)
        a = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        out = wasm.alloc(m * n * 4)
        scratch = wasm.alloc(gemm_scratch_floats(k, quantised=True) * 4)
        wasm("gemm_q", code, wasm.put(a), k, wasm.put(raw), k // bs, wasm.put(bias), out, n, m, n, wasm.table,
             scratch)
        got = wasm.get(out, (m, n), np.float32)
        assert np.all(np.abs(got - (a @ w.T + bias)) <= _bound(a, w) + 1e-6 * np.abs(bias)), (q, m, n, k)


def test_gemm_q_traps_on_an_unknown_format(wasm):
    import wasmtime
    scratch = wasm.alloc(gemm_scratch_floats(32, quantised=True) * 4)
    a, raw, out = wasm.alloc(128), wasm.alloc(64), wasm.alloc(16)
    with pytest.raises(wasmtime.Trap):
        wasm("gemm_q", len(codes.FORMATS), a, 32, raw, 1, 0, out, 1, 1, 1, wasm.table, scratch)
