"""The backend contract called directly on every device, with the inputs that take the GPU
kernels' own paths: larger, permuted and batched operands (vec4 matvec and matmul rows, rows
longer than a workgroup, batch dims that do not merge, KV-cache views), GGUF blocks read inside
the kernels, and round trips of every dtype. References: numpy, torch and the gguf package.
Device limits (device_limits.py) are expected as their UnsupportedError.
"""
import math

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.operand import Operand, QuantWeight, Rotary
from tallow.backends.specs import AttentionSpec, ConvSpec
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout

from device_limits import NARROW_INTS, int_range, refused
from storage_io import K_QUANTS, assert_quantised_product_close, bf16_bits, down, quantised_activation_error, up

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(4321)

F16 = dict(rtol=1e-2, atol=1e-3)
F32 = dict(rtol=1e-5, atol=1e-6)



def view(be, arr, dtype, perm):
    """arr stored with its dims in another order, seen through a permuted (non-contiguous)
    layout of arr's own shape: returns (storage, layout, arr)."""
    base = np.ascontiguousarray(np.transpose(arr, np.argsort(perm)))
    st = up(be, base, dtype)
    lay = Layout(base.shape).permute(perm)
    return st, lay, np.transpose(base, perm)


def rnd(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.bf16, D.i32, D.i64, D.i8, D.u8, D.u32, D.bool_])
def test_bytes_and_lists_round_trip(device, dtype):
    be = device.backend
    if dtype.is_float:
        x = rnd(7)
    elif dtype is D.bool_:
        x = RNG.integers(0, 2, 7).astype(bool)
    else:
        lo, hi = int_range(device, dtype)
        x = RNG.integers(lo, hi, 7, dtype=np.int64, endpoint=True).astype(dtype.np_name)
    raw = bf16_bits(x).tobytes() if dtype is D.bf16 else x.astype(dtype.np_name).tobytes()
    st = be.from_bytes(raw, dtype)
    assert be.to_bytes(st, Layout((7,)), dtype) == raw
    expect = down(be, st, (7,), dtype).tolist()
    got = be.to_list(st, Layout((7,)), dtype)
    assert got == (x.tolist() if dtype is D.bool_ else expect)
    assert be.to_list(be.from_list(got, dtype), Layout((7,)), dtype) == got
    # a strided read: every other element, from the second
    assert be.to_list(st, Layout((3,), (2,), 1), dtype) == got[1::2]


def test_device_limits_are_refused_clearly(device):
    """NO_DTYPE and NARROW_INTS, on this device: an UnsupportedError naming the limit; elsewhere the
    same values round-trip."""
    be = device.backend
    for dtype in (D.f64,):
        if not refused(device, dtype):
            assert be.to_list(be.from_bytes(np.array([0.1, -2.0]).tobytes(), dtype), Layout((2,)), dtype) == [0.1, -2.0]
    big = np.array([1, 1 << 40], np.int64)
    if (device.type, "i64") in NARROW_INTS:
        with pytest.raises(UnsupportedError, match="i32 range"):
            be.from_bytes(big.tobytes(), D.i64)
        with pytest.raises(UnsupportedError, match="i32 range"):
            be.from_list(big.tolist(), D.i64)
        with pytest.raises(UnsupportedError, match="i32 range"):
            be.full(2, 1 << 40, D.i64)
    else:
        assert be.to_list(be.from_bytes(big.tobytes(), D.i64), Layout((2,)), D.i64) == big.tolist()
        assert be.to_list(be.full(2, 1 << 40, D.i64), Layout((2,)), D.i64) == [1 << 40] * 2


def test_full_and_arange_edges(device):
    be = device.backend
    np.testing.assert_allclose(down(be, be.full(5, 2.5, D.f32), (5,), D.f32), np.full(5, 2.5))
    assert be.to_list(be.full(3, 7, D.i64), Layout((3,)), D.i64) == [7, 7, 7]
    assert be.to_list(be.arange(-3, 2, 4, D.i32), Layout((4,)), D.i32) == [-3, -1, 1, 3]
    np.testing.assert_allclose(be.to_list(be.arange(0.5, 0.25, 6, D.f16), Layout((6,)), D.f16),
                               np.arange(6) * 0.25 + 0.5)
    assert be.to_list(be.full(4, True, D.bool_), Layout((4,)), D.bool_) == [True] * 4
    assert be.to_list(be.full(0, 1.0, D.f32), Layout((0,)), D.f32) == []


# ---- element-wise -----------------------------------------------------------------
UNARY = {
    "neg": (np.negative, -2, 2), "abs": (np.abs, -2, 2), "exp": (np.exp, -5, 5), "log": (np.log, 0.1, 5),
    "sqrt": (np.sqrt, 0.1, 5), "rsqrt": (lambda x: 1 / np.sqrt(x), 0.1, 5), "sin": (np.sin, -4, 4),
    "cos": (np.cos, -4, 4), "tanh": (np.tanh, -20, 20), "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), -30, 30),
    "relu": (lambda x: np.maximum(x, 0), -2, 2),
    "gelu": (lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))), -6, 6),
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), -6, 6),
    "silu": (lambda x: x / (1 + np.exp(-x)), -10, 10), "square": (np.square, -3, 3),
    "reciprocal": (lambda x: 1 / x, 0.2, 3), "floor": (np.floor, -3, 3), "ceil": (np.ceil, -3, 3),
    "round": (np.round, -3, 3), "sign": (np.sign, -2, 2),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_f32_strided(device, op):
    be = device.backend
    fn, lo, hi = UNARY[op]
    x = rnd(3, 4, 5, lo=lo, hi=hi)
    st, lay, xv = view(be, x, D.f32, (2, 0, 1))
    got = down(be, be.unary(op, st, lay, D.f32), xv.shape, D.f32)
    np.testing.assert_allclose(got, fn(xv.astype(np.float64)), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["exp", "silu", "gelu", "sqrt", "neg"])
def test_unary_f16_and_bf16(device, op):
    be = device.backend
    fn, lo, hi = UNARY[op]
    x = rnd(33, lo=max(lo, 0.1) if op == "sqrt" else lo, hi=min(hi, 4))
    for dtype in (D.f16, D.bf16):
        xr = down(be, up(be, x, dtype), (33,), dtype)  # the values as the dtype holds them
        got = down(be, be.unary(op, up(be, x, dtype), Layout((33,)), dtype), (33,), dtype)
        np.testing.assert_allclose(got, fn(xr.astype(np.float64)), **F16)


def test_unary_with_arguments_and_ints(device):
    be = device.backend
    x = rnd(2, 6)
    st = up(be, x, D.f32)
    lay = Layout((2, 6))
    np.testing.assert_allclose(down(be, be.unary("clamp", st, lay, D.f32, (-0.5, 1.0)), (2, 6), D.f32),
                               np.clip(x, -0.5, 1.0))
    np.testing.assert_allclose(down(be, be.unary("clamp", st, lay, D.f32, (None, 0.3)), (2, 6), D.f32),
                               np.minimum(x, 0.3))
    np.testing.assert_allclose(down(be, be.unary("pow_scalar", st, lay, D.f32, 3.0), (2, 6), D.f32), x ** 3, **F32)
    np.testing.assert_allclose(down(be, be.unary("affine", st, lay, D.f32, (2.0, -1.0)), (2, 6), D.f32), x * 2 - 1,
                               **F32)
    assert down(be, be.unary("logical_not", st, lay, D.f32), (2, 6), D.bool_).tolist() == (x == 0).tolist()
    xi = RNG.integers(-50, 50, 12).astype(np.int32)
    si = up(be, xi, D.i32)
    li = Layout((12,))
    for op, fn in (("neg", np.negative), ("abs", np.abs), ("sign", np.sign), ("square", np.square),
                   ("relu", lambda v: np.maximum(v, 0))):
        assert down(be, be.unary(op, si, li, D.i32), (12,), D.i32).tolist() == fn(xi).tolist(), op
    assert down(be, be.unary("pow_scalar", si, li, D.i32, 3), (12,), D.i32).tolist() == (xi ** 3).tolist()
    assert down(be, be.unary("clamp", si, li, D.i32, (-5, 7)), (12,), D.i32).tolist() == np.clip(xi, -5, 7).tolist()
    xb = RNG.integers(0, 250, 9).astype(np.uint8)
    assert down(be, be.unary("neg", up(be, xb, D.u8), Layout((9,)), D.u8), (9,), D.u8).tolist() == \
        (-xb).astype(np.uint8).tolist()  # wraps to 8 bits as numpy does


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
          "maximum": np.maximum, "minimum": np.minimum}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32])
def test_binary_broadcast(device, op, dtype):
    be = device.backend
    a = rnd(3, 1, 4, lo=0.5, hi=2) if op == "pow" else rnd(3, 1, 4)
    b = rnd(1, 5, 4, lo=-2, hi=2) if op == "pow" else rnd(1, 5, 4, lo=0.5, hi=2)
    if dtype is D.i32:
        a = RNG.integers(-20, 20, (3, 1, 4)).astype(np.int32)
        b = RNG.integers(1, 9, (1, 5, 4)).astype(np.int32)
        if op == "pow":
            a, b = a % 6, b % 4
    sa, sb = up(be, a, dtype), up(be, b, dtype)
    shape = (3, 5, 4)
    la, lb = Layout(a.shape).broadcast_to(shape), Layout(b.shape).broadcast_to(shape)
    got = down(be, be.binary(op, sa, la, sb, lb, dtype), shape, dtype)
    if dtype is D.i32:
        want = np.trunc(a / b).astype(np.int64) if op == "div" else BINARY[op](a.astype(np.int64), b)
        assert got.tolist() == want.tolist()
    else:
        ar, br = down(be, sa, a.shape, dtype), down(be, sb, b.shape, dtype)
        want = BINARY[op](ar.astype(np.float64), br.astype(np.float64))
        np.testing.assert_allclose(got, want, **(F32 if dtype is D.f32 else F16))


def test_pow_negative_base_and_compare_where(device):
    be = device.backend
    a = np.array([-2.0, -2.0, 0.0, 3.0, -1.5], np.float32)
    b = np.array([3.0, 2.0, 2.0, 0.5, 0.5], np.float32)
    sa, sb, lay = up(be, a, D.f32), up(be, b, D.f32), Layout((5,))
    got = down(be, be.binary("pow", sa, lay, sb, lay, D.f32), (5,), D.f32)
    with np.errstate(invalid="ignore"):
        want = np.power(a, b)  # nan for (-1.5) ** 0.5
    np.testing.assert_allclose(got, want, **F32, equal_nan=True)
    x, y = rnd(4, 3), rnd(4, 3)
    x[0, 0] = y[0, 0]
    sx, sy = up(be, x, D.f32), up(be, y, D.f32)
    l2 = Layout((4, 3))
    for op, fn in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)):
        c = be.compare(op, sx, l2, sy, l2, D.f32)
        assert down(be, c, (4, 3), D.bool_).tolist() == fn(x, y).tolist(), op
    cond = RNG.integers(0, 2, (4, 1)).astype(bool)
    sc = up(be, cond, D.bool_)
    got = down(be, be.where(Operand(sc, Layout((4, 1)).broadcast_to((4, 3))), Operand(sx, l2),
                            Operand(sy, Layout((3, 4)).permute((1, 0))), D.f32), (4, 3), D.f32)
    np.testing.assert_array_equal(got, np.where(cond, x, y.reshape(3, 4).T))


def test_cast_rounds_and_wraps(device):
    be = device.backend
    x = np.array([-3.7, -0.5, 0.0, 0.4, 2.5, 200.9, 1e-3], np.float32)
    sx, lay = up(be, x, D.f32), Layout((7,))
    for dst in (D.i32, D.i64, D.i8, D.u8, D.bool_, D.f16, D.bf16):
        got = down(be, be.cast(sx, lay, D.f32, dst), (7,), dst)
        if dst.is_float:
            want = x.astype(np.float16) if dst is D.f16 else down(be, up(be, x, D.bf16), (7,), D.bf16)
            np.testing.assert_array_equal(got, np.asarray(want, np.float32))
        elif dst is D.bool_:
            assert got.tolist() == (x != 0).tolist()
        else:
            assert got.tolist() == np.trunc(x).astype(np.int64).astype(dst.np_name).tolist(), dst
    xi = np.array([-129, -1, 0, 1, 255, 300], np.int32)
    si = up(be, xi, D.i32)
    for dst in (D.u8, D.i8, D.f32, D.u32):
        got = down(be, be.cast(si, Layout((6,)), D.i32, dst), (6,), dst)
        assert got.tolist() == xi.astype(dst.np_name).tolist(), dst


def test_assign_in_place(device):
    be = device.backend
    dst = rnd(4, 6)
    src = rnd(6, 2)
    sd = up(be, dst, D.f32)
    be.assign(sd, Layout((4, 6)).narrow(1, 3, 2), up(be, src, D.f32), Layout((6, 2)).permute((1, 0))
              .permute((1, 0)).narrow(0, 1, 4), D.f32)
    want = dst.copy()
    want[:, 3:5] = src[1:5]
    np.testing.assert_array_equal(down(be, sd, (4, 6), D.f32), want)
    be.assign(sd, Layout((4, 6)).narrow(1, 0, 3), sd, Layout((4, 6)).narrow(1, 2, 3), D.f32)  # overlapping
    want[:, 0:3] = want[:, 2:5].copy()
    np.testing.assert_array_equal(down(be, sd, (4, 6), D.f32), want)


def test_zero_size_inputs(device):
    be = device.backend
    st = be.from_bytes(b"", D.f32)
    empty = Layout((0, 3))
    assert be.to_list(be.unary("exp", st, empty, D.f32), empty, D.f32) == []
    assert be.to_list(be.binary("add", st, empty, st, empty, D.f32), empty, D.f32) == []
    assert be.to_list(be.reduce("sum", st, empty, D.f32, (0,)), Layout((3,)), D.f32) == [0.0, 0.0, 0.0]
    assert be.to_list(be.matmul(Operand(st, Layout((0, 3))), Operand(st, Layout((3, 0))), D.f32), Layout((0, 0)), D.f32) == []
    with pytest.raises(ShapeError):
        be.reduce("max", st, empty, D.f32, (0,))


# ---- reductions ---------------------------------------------------------------------
@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (0, 1, 2)])
def test_reduce_f32(device, dims):
    be = device.backend
    x = rnd(4, 70, 3, lo=0.5, hi=1.5)
    st, lay, xv = view(be, x, D.f32, (1, 0, 2))  # a permuted view (70, 4, 3)
    for op, fn in (("sum", np.sum), ("prod", np.prod), ("max", np.max), ("min", np.min)):
        got = be.reduce(op, st, lay, D.f32, dims)
        want = fn(xv.astype(np.float64), axis=dims)
        np.testing.assert_allclose(down(be, got, want.shape, D.f32), want, rtol=2e-5, err_msg=op)


def test_argmax_argmin_and_int_reductions(device):
    be = device.backend
    x = RNG.integers(-5, 5, (6, 130)).astype(np.float32)  # many ties: the first index wins
    st = up(be, x, D.f32)
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        for d in (0, 1):
            got = down(be, be.reduce(op, st, Layout(x.shape), D.f32, (d,)), fn(x, axis=d).shape, D.i64)
            assert got.tolist() == fn(x, axis=d).tolist()
    xi = RNG.integers(-100, 100, (5, 9)).astype(np.int32)
    si = up(be, xi, D.i32)
    assert down(be, be.reduce("sum", si, Layout((5, 9)), D.i32, (1,)), (5,), D.i64).tolist() == xi.sum(1).tolist()
    assert down(be, be.reduce("max", si, Layout((5, 9)), D.i32, (0,)), (9,), D.i32).tolist() == xi.max(0).tolist()
    xb = RNG.integers(0, 2, (4, 7)).astype(bool)
    sb = up(be, xb, D.bool_)
    assert down(be, be.reduce("sum", sb, Layout((4, 7)), D.bool_, (0, 1)), (), D.i64).tolist() == int(xb.sum())
    xh = rnd(3, 50)
    sh = up(be, xh, D.f16)
    np.testing.assert_allclose(down(be, be.reduce("sum", sh, Layout((3, 50)), D.f16, (1,)), (3,), D.f16),
                               down(be, sh, (3, 50), D.f16).sum(1), **F16)


def test_cumsum_of_a_permuted_view(device):
    be = device.backend
    x = rnd(3, 5, 4)
    st, lay, xv = view(be, x, D.f32, (2, 1, 0))
    for d in range(3):
        np.testing.assert_allclose(down(be, be.cumsum(st, lay, D.f32, d), xv.shape, D.f32), np.cumsum(xv, d), **F32)
    xi = RNG.integers(-9, 9, (4, 6)).astype(np.int32)
    got = be.cumsum(up(be, xi, D.i32), Layout((4, 6)), D.i32, 1)
    assert down(be, got, (4, 6), D.i64).tolist() == np.cumsum(xi, 1).tolist()


# ---- linear algebra ------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(1, 37, 29), (5, 7, 3), (33, 65, 18), (64, 64, 64), (6, 12, 9)])
def test_matmul_batched_and_strided(device, m, k, n):
    be = device.backend
    a = rnd(2, 3, m, k)
    bt = rnd(2, 3, n, k)  # b is used transposed: a strided (k, n) view
    sa, sb = up(be, a, D.f32), up(be, bt, D.f32)
    lb = Layout(bt.shape).permute((0, 1, 3, 2))
    got = down(be, be.matmul(Operand(sa, Layout(a.shape)), Operand(sb, lb), D.f32), (2, 3, m, n), D.f32)
    np.testing.assert_allclose(got, a.astype(np.float64) @ np.swapaxes(bt, -1, -2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [D.f32, D.f16])
def test_matvec_through_linear_weights(device, dtype):
    be = device.backend
    """m == 1 against w^T (rows of w contiguous: the vec4 matvec_rows kernel), with
    batches, a strided x, n not a multiple of 4 columns, and w starting at an offset;
    m == 6 with contiguous x (the vec4 matmul_rows kernel)."""
    tol = F32 if dtype is D.f32 else dict(rtol=2e-3, atol=2e-3)
    n, k = 7, 12
    wt = rnd(2, 3, n + 1, k)
    x = rnd(2, 3, k, 1)  # stored transposed: x is the strided (2, 3, 1, k) view
    sw, sx = up(be, wt, dtype), up(be, x, dtype)
    lw = Layout(wt.shape).narrow(2, 1, n).permute((0, 1, 3, 2))  # offset k: still whole vec4s
    lx = Layout(x.shape).permute((0, 1, 3, 2))
    wr, xr = down(be, sw, wt.shape, dtype)[:, :, 1:], down(be, sx, x.shape, dtype)
    got = down(be, be.matmul(Operand(sx, lx), Operand(sw, lw), dtype), (2, 3, 1, n), dtype)
    np.testing.assert_allclose(got, np.swapaxes(xr, -1, -2).astype(np.float64) @ np.swapaxes(wr, -1, -2), **tol)
    x6 = rnd(2, 3, 6, k)
    s6 = up(be, x6, dtype)
    got = down(be, be.matmul(Operand(s6, Layout(x6.shape)), Operand(sw, lw), dtype), (2, 3, 6, n), dtype)
    want = down(be, s6, x6.shape, dtype).astype(np.float64) @ np.swapaxes(wr, -1, -2)
    np.testing.assert_allclose(got, want, **tol)
    # k not a multiple of 4 takes the scalar matvec
    sw2 = up(be, wt[..., :9], dtype)
    lw2 = Layout((2, 3, n + 1, 9)).permute((0, 1, 3, 2))
    x2 = rnd(2, 3, 1, 9)
    got = down(be, be.matmul(Operand(up(be, x2, dtype), Layout(x2.shape)), Operand(sw2, lw2), dtype), (2, 3, 1, n + 1), dtype)
    want = down(be, up(be, x2, dtype), x2.shape, dtype) @ np.swapaxes(down(be, sw2, (2, 3, n + 1, 9), dtype), -1, -2)
    np.testing.assert_allclose(got, want, **tol)


def test_matmul_broadcast_batch_non_mergeable_and_f16(device):
    be = device.backend
    a = rnd(4, 6, 8)
    b = rnd(8, 5)
    sa, sb = up(be, a, D.f32), up(be, b, D.f32)
    lb = Layout((8, 5)).broadcast_to((4, 8, 5))  # batch stride 0
    got = down(be, be.matmul(Operand(sa, Layout(a.shape)), Operand(sb, lb), D.f32), (4, 6, 5), D.f32)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    # batch dims that cannot merge into one stride: (2, 3) taken from a (3, 2, ...) tensor
    a2 = rnd(3, 2, 6, 8)
    sa2 = up(be, a2, D.f32)
    la2 = Layout(a2.shape).permute((1, 0, 2, 3))
    lb2 = Layout((8, 5)).broadcast_to((2, 3, 8, 5))
    got = down(be, be.matmul(Operand(sa2, la2), Operand(sb, lb2), D.f32), (2, 3, 6, 5), D.f32)
    np.testing.assert_allclose(got, np.transpose(a2, (1, 0, 2, 3)) @ b, rtol=1e-5, atol=1e-5)
    ha, hb = up(be, a, D.f16), up(be, b, D.f16)
    got = down(be, be.matmul(Operand(ha, Layout(a.shape)), Operand(hb, lb), D.f16), (4, 6, 5), D.f16)
    want = down(be, ha, a.shape, D.f16) @ down(be, hb, b.shape, D.f16)
    np.testing.assert_allclose(got, want, **F16)


def _random_blocks(qname, nblocks):
    """Random GGUF blocks with sane f16 scales (random bytes elsewhere exercise every bit)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    qt = GGMLQuantizationType[qname.upper()]
    _, block_bytes = GGML_QUANT_SIZES[qt]
    blocks = RNG.integers(0, 256, (nblocks, block_bytes), dtype=np.uint8)
    scale_at = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q4_k": [0, 2], "q6_k": [208]}[qname]
    for at in scale_at:
        blocks[:, at:at + 2] = RNG.uniform(0.01, 0.1, (nblocks, 1)).astype(np.float16).view(np.uint8)
    return blocks, qt


@pytest.mark.parametrize("qname,n,k", [("q8_0", 24, 512), ("q4_0", 24, 512), ("q4_1", 24, 512),
                                        ("q4_k", 24, 512), ("q6_k", 24, 512),
                                        # rows of 3 blocks: 18/34-byte blocks start off word boundaries;
                                        # n not a multiple of the 4 columns per invocation
                                        ("q8_0", 7, 96), ("q4_0", 7, 96), ("q4_1", 5, 96), ("q4_k", 6, 256)])
def test_quantized_matvec_matmul_dequantize(device, qname, n, k):
    be = device.backend
    import tallow.quant  # noqa: F401  (registers the block dtypes)
    gq = pytest.importorskip("gguf.quants")
    qdt = D.get_dtype(qname)
    blocks, qt = _random_blocks(qname, n * k // qdt.block_size)
    w_ref = gq.dequantize(blocks.reshape(n, -1), qt).astype(np.float64)  # (n, k)
    sw = be.from_bytes(blocks.tobytes(), qdt)
    for m, xdt in ((1, D.f32), (3, D.f32), (6, D.f32), (1, D.f16), (3, D.f16)):
        x = down(be, up(be, rnd(m, k), xdt), (m, k), xdt).astype(np.float64)
        got = down(be, be.qmatmul(Operand(up(be, x, xdt), Layout((m, k))), QuantWeight(sw, qdt, n, k), xdt), (m, n), xdt)
        # f32 accumulation over k terms (f16 output rounding): bound the error by the sum of |terms|;
        # the K-quants: plus the CPU kernels' 8-bit activations (storage_io.quantised_activation_error)
        bound = np.abs(x) @ np.abs(w_ref).T
        rel = 3e-5 if xdt is D.f32 else 1e-3
        extra = quantised_activation_error(x, w_ref, qname) if qname in K_QUANTS else 0
        assert np.all(np.abs(got - x @ w_ref.T) <= rel * bound + extra + 1e-6), (m, xdt.name)
    got = down(be, be.dequantize(sw, qdt, n * k, D.f32), (n * k,), D.f32)
    np.testing.assert_array_equal(got, w_ref.reshape(-1).astype(np.float32))
    ids = np.array([3, 0, n - 1, 3], np.int64)
    rows = be.index_select(Operand(sw, Layout((n, k))), Operand(up(be, ids, D.i64), Layout((4,))), qdt, 0)
    np.testing.assert_array_equal(down(be, rows, (4, k), D.f32), w_ref[ids].astype(np.float32))
    assert be.to_bytes(sw, Layout((n, k)), qdt) == blocks.tobytes()


def test_other_block_formats_are_dequantized_on_upload(device):
    be = device.backend
    import tallow.quant  # noqa: F401
    gq = pytest.importorskip("gguf.quants")
    from gguf.constants import GGMLQuantizationType
    w = rnd(8, 64)
    blocks = gq.quantize(w, GGMLQuantizationType.Q5_0)
    ref = gq.dequantize(blocks, GGMLQuantizationType.Q5_0)
    qdt = D.get_dtype("q5_0")
    sw = be.from_bytes(blocks.tobytes(), qdt)
    x = rnd(3, 64)
    got = down(be, be.qmatmul(Operand(up(be, x, D.f32), Layout((3, 64))), QuantWeight(sw, qdt, 8, 64), D.f32), (3, 8), D.f32)
    assert_quantised_product_close(got, x, ref)


# ---- indexing -------------------------------------------------------------------------------
def test_index_select_gather_scatter_add(device):
    be = device.backend
    x = rnd(4, 5, 6)
    st, lay, xv = view(be, x, D.f32, (1, 0, 2))  # stored as (5, 4, 6)
    ids = np.array([3, 0, 3, 2, 2], np.int64)  # in range for every dim (the front end checks ids)
    sid = up(be, ids, D.i64)
    for dim in range(3):
        sel = ids
        got = be.index_select(Operand(st, lay), Operand(sid, Layout((5,))), D.f32, dim)
        want = np.take(xv, sel, axis=dim)
        np.testing.assert_array_equal(down(be, got, want.shape, D.f32), want)
    gidx = RNG.integers(0, 5, (4, 3, 6)).astype(np.int64)
    got = be.gather(Operand(st, lay), Operand(up(be, gidx, D.i64), Layout(gidx.shape)), D.f32, 1)
    np.testing.assert_array_equal(down(be, got, gidx.shape, D.f32), np.take_along_axis(xv, gidx, 1))
    dst = rnd(4, 6)
    src = rnd(7, 3)
    sidx = RNG.integers(0, 4, (7, 3)).astype(np.int64)  # repeated ids must accumulate
    got = be.scatter_add(Operand(up(be, dst, D.f32), Layout((4, 6))), Operand(up(be, sidx, D.i64), Layout((7, 3))),
                         Operand(up(be, src, D.f32), Layout((7, 3))), D.f32, 0)
    want = dst.astype(np.float64).copy()
    np.add.at(want, (sidx, np.arange(3)[None, :].repeat(7, 0)), src)
    np.testing.assert_allclose(down(be, got, (4, 6), D.f32), want, **F32)


# ---- convolution and fused ops -----------------------------------------------------------------
def test_conv1d_conv2d_strided_dilated_grouped(device):
    be = device.backend
    x, w = rnd(2, 6, 17), rnd(4, 3, 3)
    got = be.conv1d(Operand(up(be, x, D.f32), Layout(x.shape)), Operand(up(be, w, D.f32), Layout(w.shape)), D.f32,
                    ConvSpec(2, 1, 2, 2))
    want = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1, dilation=2, groups=2).numpy()
    np.testing.assert_allclose(down(be, got, want.shape, D.f32), want, rtol=1e-5, atol=1e-5)
    x2, w2 = rnd(1, 3, 9, 8), rnd(5, 3, 3, 2)
    got = be.conv2d(Operand(up(be, x2, D.f32), Layout(x2.shape)), Operand(up(be, w2, D.f32), Layout(w2.shape)), D.f32,
                    ConvSpec((2, 1), (1, 0), (1, 2), 1))
    want = F.conv2d(torch.from_numpy(x2), torch.from_numpy(w2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)).numpy()
    np.testing.assert_allclose(down(be, got, want.shape, D.f32), want, rtol=1e-5, atol=1e-5)


def test_softmax_and_norms(device):
    be = device.backend
    x = rnd(3, 5, 100, lo=-8, hi=8)
    st, lay, xv = view(be, x, D.f32, (0, 2, 1))  # rows of 100 along a strided dim
    xd = xv.astype(np.float64)
    e = np.exp(xd - xd.max(-1, keepdims=True))
    np.testing.assert_allclose(down(be, be.softmax(st, lay, D.f32), xv.shape, D.f32), e / e.sum(-1, keepdims=True),
                               **F32)
    np.testing.assert_allclose(down(be, be.softmax(st, lay, D.f32, log=True), xv.shape, D.f32),
                               np.log(e / e.sum(-1, keepdims=True)), rtol=1e-5, atol=1e-5)
    w, b = rnd(100), rnd(100)
    sw, sb = up(be, w, D.f32), up(be, b, D.f32)
    mu = xd.mean(-1, keepdims=True)
    ln = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    got = be.layer_norm(Operand(st, lay), Operand(sw, Layout((100,))), Operand(sb, Layout((100,))), D.f32, 1e-5)
    np.testing.assert_allclose(down(be, got, xv.shape, D.f32), ln, rtol=1e-5, atol=1e-5)
    rms = xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-6) * w
    got = be.rms_norm(Operand(st, lay), Operand(sw, Layout((100,))), D.f32, 1e-6)
    np.testing.assert_allclose(down(be, got, xv.shape, D.f32), rms, rtol=1e-5, atol=1e-5)
    got = be.layer_norm(Operand(st, lay), None, None, D.f32, 1e-5)
    np.testing.assert_allclose(down(be, got, xv.shape, D.f32), (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5),
                               rtol=1e-5, atol=1e-5)
    sh = up(be, xv, D.f16)
    xh = down(be, sh, xv.shape, D.f16).astype(np.float64)
    eh = np.exp(xh - xh.max(-1, keepdims=True))
    np.testing.assert_allclose(down(be, be.softmax(sh, Layout(xv.shape), D.f16), xv.shape, D.f16),
                               eh / eh.sum(-1, keepdims=True), **F16)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_of_a_permuted_view(device, interleaved):
    be = device.backend
    bsz, h, t, d = 2, 3, 5, 8
    x = rnd(bsz, h, t, d)
    st, lay, xv = view(be, x, D.f32, (0, 2, 1, 3))  # (b, h, t, d) view of (b, t, h, d) storage
    ang = rnd(t, d // 2, lo=0, hi=6)
    c, s = np.cos(ang), np.sin(ang)
    got = down(be, be.rope(Operand(st, lay), Rotary(Operand(up(be, c, D.f32), Layout(c.shape)),
                                                    Operand(up(be, s, D.f32), Layout(s.shape)), interleaved), D.f32), xv.shape, D.f32)
    if interleaved:
        x1, x2 = xv[..., 0::2], xv[..., 1::2]
        want = np.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(xv.shape)
    else:
        x1, x2 = xv[..., :d // 2], xv[..., d // 2:]
        want = np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)
    np.testing.assert_allclose(got, want, **F32)


@pytest.mark.parametrize("tq,causal,masked", [(5, True, False), (1, False, True), (3, True, True)])
def test_attention_over_a_strided_kv_cache(device, tq, causal, masked):
    be = device.backend
    bsz, h, tk, d, dv = 2, 3, 7, 16, 8
    q, k, v = rnd(bsz, h, tq, d), rnd(bsz, h, tk, d), rnd(bsz, h, tk, dv)
    sk, lk, kv = view(be, k, D.f32, (0, 2, 1, 3))  # keys strided as a KV cache laid out (b, t, h, d)
    mask = np.where(RNG.random((1, 1, tq, tk)) < 0.2, -np.inf, 0).astype(np.float32)
    mask[..., 0] = 0  # every row keeps a key
    scale = 1 / math.sqrt(d)
    sm = up(be, mask, D.f32) if masked else None
    lm = Layout(mask.shape).broadcast_to((bsz, h, tq, tk)) if masked else None
    got = be.attention(Operand(up(be, q, D.f32), Layout(q.shape)), Operand(sk, lk), Operand(up(be, v, D.f32), Layout(v.shape)),
                       None if sm is None else Operand(sm, lm), D.f32, AttentionSpec(scale, causal))
    tmask = torch.from_numpy(mask) if masked else torch.zeros(1, 1, tq, tk)
    if causal:
        banned = torch.arange(tk)[None, :] > torch.arange(tq)[:, None] + (tk - tq)
        tmask = tmask.masked_fill(banned, float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(np.ascontiguousarray(kv)), torch.from_numpy(v), attn_mask=tmask,
        scale=scale).numpy()
    np.testing.assert_allclose(down(be, got, want.shape, D.f32), want, rtol=1e-5, atol=1e-5)
