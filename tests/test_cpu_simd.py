"""The vector-IR pair dots (tallow.quant.cpu_simd) against their numpy statement (pair_dot_py),
with the target's multiply-pairs instruction and with the generic IR other targets (arm64) get.
End to end, tests/test_cpu_kernels.py checks the products against dequantise-then-numpy."""
import numpy as np
import pytest

pytest.importorskip("numba")
from numba import njit

from tallow.dtypes import get_dtype
from tallow.quant import cpu_int_kernels, cpu_kernels, cpu_simd

NAMES = {0: "q4_0", 1: "q4_1", 2: "q5_0", 3: "q5_1", 4: "q8_0"}


def _compiled(fmt, x86_madd, monkeypatch):
    """A fresh pair dot for fmt, its IR generated with or without the x86 instruction (at compile time)."""
    monkeypatch.setattr(cpu_simd, "_X86_MADD", x86_madd)
    dot = cpu_simd._make_pair_dot(fmt)

    @njit
    def run(raw, oa, ob, blocks, bb, xi, dxi, sxi, table):
        return dot(raw, oa, ob, blocks, bb, xi, dxi, sxi, table)
    return run


def _inputs(fmt, rng, blocks, extreme):
    """Two rows of `blocks` blocks and one quantised activation row. extreme: every quant bit set
    and activations at +-32767 (the largest int32 sums the kernels can meet)."""
    d = get_dtype(NAMES[fmt])
    raw = rng.integers(0, 256, size=(2 * blocks, d.block_bytes), dtype=np.uint8)
    if extreme:
        raw[:, 2:] = 0xFF if fmt != 4 else 0x80  # q8_0: -128 everywhere
    for at in (0, cpu_simd.MIN_AT.get(fmt, 0)):
        raw[:, at:at + 2] = rng.uniform(-2, 2, size=2 * blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    x = rng.standard_normal((1, 32 * blocks)).astype(np.float32)
    if extreme:
        x = np.where(np.arange(32 * blocks) % 3 == 0, -1.0, 1.0).astype(np.float32)[None]
    qx = np.empty((1, 32 * blocks), np.int16)
    dx, sx = np.empty((1, blocks), np.float32), np.empty((1, blocks), np.int32)
    cpu_int_kernels.quantize_rows(x, 32767, qx, dx, sx)
    return raw.reshape(-1), blocks * d.block_bytes, qx[0], dx[0], sx[0]


@pytest.mark.parametrize("fmt", sorted(NAMES))
@pytest.mark.parametrize("x86_madd", ["llvm.x86.avx2.pmadd.wd", None], ids=["x86", "generic"])
@pytest.mark.parametrize("extreme", [False, True])
def test_pair_dot_matches_its_numpy_statement(fmt, x86_madd, extreme, monkeypatch):
    if x86_madd and not cpu_simd._has_avx2():
        pytest.skip("this CPU has no AVX2: the x86 form is never generated here")
    rng = np.random.default_rng(fmt)
    blocks = 7
    raw, row_bytes, xi, dxi, sxi = _inputs(fmt, rng, blocks, extreme)
    d = get_dtype(NAMES[fmt])
    run = _compiled(fmt, x86_madd, monkeypatch)
    got = run(raw, 0, row_bytes, blocks, d.block_bytes, xi, dxi, sxi, cpu_kernels.F16_TABLE)
    want = cpu_simd.pair_dot_py(fmt, raw, 0, row_bytes, blocks, d.block_bytes, xi, dxi, sxi, cpu_kernels.F16_TABLE)
    # The same integer sums per block; only the float32 summation order differs.
    scale = 32 * 32767 * 32 * blocks * float(np.abs(dxi).max()) * 2
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6 * scale), (got, want)


def test_only_contiguous_arrays_of_the_right_dtypes_compile():
    """The IR reads raw memory: a strided or wrongly typed array must fail to compile, not read garbage."""
    from numba.core.errors import TypingError
    rng = np.random.default_rng(3)
    raw, row_bytes, xi, dxi, sxi = _inputs(1, rng, 2, False)

    @njit
    def run(raw, xi):
        return cpu_simd.pair_dot_q4_1(raw, 0, row_bytes, 2, 20, xi, dxi, sxi, cpu_kernels.F16_TABLE)
    with pytest.raises(TypingError):
        run(raw, np.repeat(xi, 2)[::2])
    with pytest.raises(TypingError):
        run(raw, xi.astype(np.int32))
