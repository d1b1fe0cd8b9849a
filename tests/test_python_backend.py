"""Backend-level tests of the pure-Python backend against numpy and torch.

Every primitive is called directly with (storage, Layout) pairs over
contiguous, offset, transposed, strided and broadcast layouts, zero-size and
0-d shapes, for several dtypes. References are numpy (f32/f16/ints/bool) and
torch (bf16, and the activations / conv / attention numpy lacks).
"""
import math
import subprocess
import sys

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.python_backend import PythonBackend
from tallow.errors import FormatError, ShapeError
from tallow.layout import Layout

torch = pytest.importorskip("torch")
F = torch.nn.functional

B = PythonBackend()
RNG = np.random.default_rng(1234)

NP_TYPES = {D.f64: np.float64, D.f32: np.float32, D.f16: np.float16, D.i64: np.int64, D.i32: np.int32,
            D.i8: np.int8, D.u8: np.uint8, D.u32: np.uint32, D.bool_: np.bool_}
TOL = {D.f64: (1e-12, 1e-12), D.f32: (2e-6, 1e-6), D.f16: (2e-3, 1e-3), D.bf16: (1.6e-2, 1e-2)}
FLOATS = [D.f32, D.f16, D.bf16]
KINDS = ["contiguous", "offset", "transposed", "strided", "broadcast"]


# ---- helpers -------------------------------------------------------------------------
def bf16_round(x):
    return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def as_dtype(x, dtype):
    """numpy array holding values exactly representable in dtype (bf16 -> f32 holder)."""
    if dtype is D.bf16:
        return bf16_round(x)
    return np.asarray(x).astype(NP_TYPES[dtype])


def random_values(shape, dtype, scale=2.0):
    if dtype.is_float:
        return as_dtype(RNG.standard_normal(shape) * scale, dtype)
    if dtype is D.bool_:
        return RNG.random(shape) < 0.5
    lo = 0 if dtype.kind == "u" else -50
    return RNG.integers(lo, 50, shape).astype(NP_TYPES[dtype])


def py_values(arr):
    return np.asarray(arr).ravel().tolist()


def place(arr, dtype, kind="contiguous"):
    """Storage and a layout of the given kind whose elements read back as arr."""
    arr = np.asarray(arr)
    shape = arr.shape
    if kind == "offset":
        junk = [7] * 3
        st = B.from_list(junk + py_values(arr) + [7, 7], dtype)
        return st, Layout(shape, None, 3)
    if kind == "transposed" and arr.ndim >= 2:
        rev = list(range(arr.ndim))[::-1]
        stored = np.ascontiguousarray(arr.transpose(rev))
        return B.from_list(py_values(stored), dtype), Layout(stored.shape).permute(rev)
    if kind == "strided" and arr.ndim >= 1:
        holder = np.zeros(shape[:-1] + (shape[-1] * 2 + 1,), dtype=arr.dtype)
        holder[..., 1::2][..., :shape[-1]] = arr
        strides = list(Layout(holder.shape).strides)
        strides[-1] = 2
        return B.from_list(py_values(holder), dtype), Layout(shape, strides, 1)
    if kind == "broadcast" and arr.ndim >= 1:
        # Reading must give arr, so arr must be constant along dim 0: keep row 0 only.
        row = arr[:1]
        st = B.from_list(py_values(row), dtype)
        return st, Layout(row.shape).broadcast_to(shape)
    return B.from_list(py_values(arr), dtype), Layout(shape)


def make(shape, dtype, kind="contiguous", scale=2.0):
    arr = random_values(shape, dtype, scale)
    if kind == "broadcast" and arr.ndim >= 1 and arr.shape[0] > 0:
        arr = np.broadcast_to(arr[:1], arr.shape).copy()
    st, lay = place(arr, dtype, kind)
    return arr, st, lay


def result(storage, shape, dtype):
    return np.array(B.to_list(storage, Layout(shape), dtype),
                    dtype=np.float64 if dtype.is_float else None).reshape(shape)


def check(got, ref, dtype):
    ref = np.asarray(ref)
    if dtype.is_float:
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, ref.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, ref)


def torch_ref(fn, *arrays, dtype):
    """fn over torch tensors in the dtype's own precision (bf16 for bf16), as numpy f64."""
    tdt = {D.f32: torch.float32, D.f16: torch.float32, D.bf16: torch.bfloat16, D.f64: torch.float64}[dtype]
    out = fn(*[torch.from_numpy(np.asarray(a, np.float32 if dtype is not D.f64 else np.float64)).to(tdt)
               for a in arrays])
    if dtype is D.f16:
        out = out.half()
    return out.double().numpy()


# ---- memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f64, D.f32, D.f16, D.i64, D.i32, D.i8, D.u8, D.u32, D.bool_])
def test_bytes_roundtrip_matches_numpy(dtype):
    arr = random_values((3, 5), dtype)
    raw = arr.astype(np.dtype(NP_TYPES[dtype]).newbyteorder("<")).tobytes()
    st = B.from_bytes(raw, dtype)
    assert B.to_list(st, Layout((15,)), dtype) == arr.ravel().tolist()
    assert B.to_bytes(st, Layout((15,)), dtype) == raw
    # a transposed view serialises in row-major order
    assert B.to_bytes(st, Layout((3, 5)).permute((1, 0)), dtype) == np.ascontiguousarray(arr.T).astype(
        np.dtype(NP_TYPES[dtype]).newbyteorder("<")).tobytes()


def test_bf16_bytes_and_rounding_match_torch():
    special = [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-40, math.inf, -math.inf, 65504.0]
    x = np.concatenate([RNG.standard_normal(200).astype(np.float32), np.array(special, np.float32)])
    t = torch.from_numpy(x).to(torch.bfloat16)
    st = B.from_list(x.tolist(), D.bf16)
    assert B.to_list(st, Layout((len(x),)), D.bf16) == t.float().numpy().tolist()
    raw = t.view(torch.int16).numpy().tobytes()
    assert B.to_bytes(st, Layout((len(x),)), D.bf16) == raw
    assert B.to_list(B.from_bytes(raw, D.bf16), Layout((len(x),)), D.bf16) == t.float().numpy().tolist()
    nan = B.to_list(B.from_list([math.nan], D.bf16), Layout((1,)), D.bf16)[0]
    assert math.isnan(nan)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_f16_rounding_matches_numpy_including_overflow():
    x = np.concatenate([RNG.standard_normal(200) * 1000, [65504.0, 65519.0, 65520.0, 7e4, -7e4, 6e-8, 1e-9, math.inf]])
    got = B.to_list(B.from_list(x.tolist(), D.f16), Layout((len(x),)), D.f16)
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float64))


def test_from_bytes_rejects_partial_elements():
    with pytest.raises(FormatError, match="f32"):
        B.from_bytes(b"\x00" * 6, D.f32)


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.i64, D.bool_])
def test_full_and_arange(dtype):
    assert B.to_list(B.full(4, 3, dtype), Layout((4,)), dtype) == np.full(4, 3, NP_TYPES[dtype]).tolist()
    assert B.to_list(B.full(0, 3, dtype), Layout((0,)), dtype) == []
    if dtype is not D.bool_:
        ref = (2 + 3 * np.arange(6, dtype=np.float64)).astype(NP_TYPES[dtype])
        assert B.to_list(B.arange(2, 3, 6, dtype), Layout((6,)), dtype) == ref.tolist()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4), (4, 1, 9)])
def test_copy_reads_every_layout(kind, shape):
    arr, st, lay = make(shape, D.f32, kind)
    check(result(B.copy(st, lay, D.f32), shape, D.f32), arr, D.f32)


def test_copy_with_negative_stride():
    st = B.from_list(list(range(12)), D.i32)
    lay = Layout((3, 4), (4, -1), 3)  # each row reversed
    assert (B.to_list(B.copy(st, lay, D.i32), Layout((3, 4)), D.i32)
            == np.arange(12).reshape(3, 4)[:, ::-1].ravel().tolist())


def test_assign_into_strided_view():
    dst = B.from_list([0.0] * 20, D.f32)
    arr, src, ls = make((3, 4), D.f32, "transposed")
    target = Layout((3, 4), (5, 1), 1)  # a (3, 4) window of a (4, 5) buffer
    B.assign(dst, target, src, ls, D.f32)
    ref = np.zeros(20, np.float32)
    view = np.lib.stride_tricks.as_strided(ref[1:], (3, 4), (20, 4))
    view[...] = arr
    check(result(dst, (20,), D.f32), ref, D.f32)
    dst2 = B.from_list([0] * 12, D.i32)
    arr2, src2, ls2 = make((4, 3), D.i32)
    B.assign(dst2, Layout((4, 3), (1, 4)), src2, ls2, D.i32)  # transposed destination
    assert B.to_list(dst2, Layout((12,)), D.i32) == arr2.T.ravel().tolist()


@pytest.mark.parametrize("src,dst", [(D.f32, D.i32), (D.f32, D.f16), (D.f32, D.bf16), (D.f16, D.f32), (D.i64, D.i8),
                                     (D.i32, D.f32), (D.f32, D.bool_), (D.bool_, D.f32), (D.i32, D.u8), (D.f64, D.f32)])
def test_cast_matches_numpy_and_torch(src, dst):
    arr, st, lay = make((4, 6), src, "transposed", scale=100.0)
    if src.is_int:
        arr = (arr.astype(np.int64) * 7).astype(NP_TYPES[src])
        st, lay = place(arr, src, "transposed")
    got = result(B.cast(st, lay, src, dst), (4, 6), dst)
    if dst is D.bf16:
        ref = bf16_round(arr)
    elif src.is_float and dst.is_int:
        ref = np.trunc(arr).astype(NP_TYPES[dst])
    else:
        ref = np.asarray(arr).astype(NP_TYPES[dst])
    check(got, ref, dst if dst.is_float else D.i64)


# ---- element-wise ----------------------------------------------------------------------------
UNARY_TORCH = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "square": torch.square, "reciprocal": torch.reciprocal, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "sign": torch.sign,
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY_TORCH))
def test_unary_float(op, dtype):
    kind = KINDS[sorted(UNARY_TORCH).index(op) % len(KINDS)]
    arr, st, lay = make((3, 7), dtype, kind)
    if op in ("log", "sqrt", "rsqrt"):
        arr = as_dtype(np.abs(arr) + 0.1, dtype)
        st, lay = place(arr, dtype, kind)
    got = result(B.unary(op, st, lay, dtype), arr.shape, dtype)
    # Reference: torch in f64 on the same (dtype-exact) inputs, rounded to the dtype.
    ref = UNARY_TORCH[op](torch.from_numpy(arr.astype(np.float64)))
    ref = ref.to({D.f32: torch.float32, D.f16: torch.float16, D.bf16: torch.bfloat16}[dtype]).double().numpy()
    check(got, ref, dtype)


def test_unary_ieee_corner_cases_match_numpy():
    x = np.array([0.0, -0.0, -1.0, 1000.0, -1000.0, math.inf, -math.inf, math.nan, 0.5, 1.5, 2.5, -2.5], np.float32)
    st, lay = place(x, D.f32)
    with np.errstate(all="ignore"):
        refs = {
            "exp": np.exp(x), "log": np.log(x), "sqrt": np.sqrt(x), "rsqrt": 1 / np.sqrt(x), "sin": np.sin(x),
            "reciprocal": 1 / x, "floor": np.floor(x), "ceil": np.ceil(x), "round": np.round(x), "sign": np.sign(x),
            "relu": np.maximum(x, 0), "tanh": np.tanh(x), "abs": np.abs(x),
            "sigmoid": torch.sigmoid(torch.from_numpy(x)).numpy(),
        }
    for op, ref in refs.items():
        got = result(B.unary(op, st, lay, D.f32), x.shape, D.f32)
        np.testing.assert_allclose(got, ref, rtol=2e-6, equal_nan=True, err_msg=op)
    assert B.to_list(B.unary("logical_not", st, lay, D.f32), lay, D.bool_) == np.logical_not(x).tolist()


@pytest.mark.parametrize("dtype", [D.i8, D.i32, D.i64, D.u8])
def test_unary_int_wraps_like_numpy(dtype):
    info = np.iinfo(NP_TYPES[dtype])
    arr = np.array([info.min, info.max, 0, 3, -5 if dtype.kind == "i" else 5, 100, 17], NP_TYPES[dtype])
    st, lay = place(arr, dtype, "strided")
    with np.errstate(all="ignore"):
        for op, ref in [("neg", -arr), ("abs", np.abs(arr)), ("square", arr * arr), ("sign", np.sign(arr)),
                        ("relu", np.maximum(arr, 0)), ("round", arr)]:
            assert B.to_list(B.unary(op, st, lay, dtype), Layout(arr.shape), dtype) == ref.tolist(), op
        assert B.to_list(B.unary("pow_scalar", st, lay, dtype, 3), Layout(arr.shape), dtype) == (arr ** 3).tolist()
        ref = np.clip(arr, 2, 90)
        assert B.to_list(B.unary("clamp", st, lay, dtype, (2, 90)), Layout(arr.shape), dtype) == ref.tolist()
        ref = (arr * np.array(3, arr.dtype) + np.array(4, arr.dtype))
        assert B.to_list(B.unary("affine", st, lay, dtype, (3, 4)), Layout(arr.shape), dtype) == ref.tolist()


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_with_arguments_float(dtype):
    arr, st, lay = make((4, 5), dtype, "transposed")
    for op, arg, ref in [("clamp", (-0.5, 0.7), np.clip(arr, -0.5, 0.7)), ("clamp", (None, 0.7), np.minimum(arr, 0.7)),
                         ("clamp", (0.1, None), np.maximum(arr, 0.1)), ("affine", (1.5, -0.25), arr * 1.5 - 0.25),
                         ("pow_scalar", 3.0, arr.astype(np.float64) ** 3),
                         ("pow_scalar", 0.5, np.sqrt(np.abs(arr.astype(np.float64))))]:
        src_st, src_lay = (place(np.abs(arr), dtype, "transposed") if arg == 0.5 else (st, lay))
        got = result(B.unary(op, src_st, src_lay, dtype, arg), arr.shape, dtype)
        check(got, as_dtype(ref, dtype).astype(np.float64), dtype)


BINARY_TORCH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
                "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(BINARY_TORCH))
@pytest.mark.parametrize("kinds", [("contiguous", "broadcast"), ("transposed", "offset"), ("strided", "transposed")])
def test_binary_float(op, dtype, kinds):
    a, sa, la = make((4, 6), dtype, kinds[0])
    b, sb, lb = make((4, 6), dtype, kinds[1])
    if op == "pow":
        a = as_dtype(np.abs(a) + 0.5, dtype)
        sa, la = place(a, dtype, kinds[0])
    got = result(B.binary(op, sa, la, sb, lb, dtype), a.shape, dtype)
    ref = BINARY_TORCH[op](torch.from_numpy(a.astype(np.float64)), torch.from_numpy(b.astype(np.float64)))
    ref = ref.to({D.f32: torch.float32, D.f16: torch.float16, D.bf16: torch.bfloat16}[dtype]).double().numpy()
    check(got, ref, dtype)


def test_binary_ieee_corner_cases():
    a = np.array([1.0, -1.0, 0.0, math.nan, 2.0, -8.0, 0.0, 1e30, math.inf], np.float32)
    b = np.array([0.0, 0.0, 0.0, 1.0, math.nan, 0.5, -1.0, 1e30, math.inf], np.float32)
    sa, la = place(a, D.f32)
    sb, lb = place(b, D.f32)
    with np.errstate(all="ignore"):
        for op, ref in [("div", a / b), ("pow", np.power(a, b)), ("maximum", np.maximum(a, b)),
                        ("minimum", np.minimum(a, b)), ("mul", a * b), ("sub", a - b)]:
            np.testing.assert_array_equal(result(B.binary(op, sa, la, sb, lb, D.f32), a.shape, D.f32), ref, err_msg=op)


@pytest.mark.parametrize("dtype", [D.i8, D.i32, D.i64, D.u8, D.u32])
def test_binary_int_wraps_like_numpy(dtype):
    info = np.iinfo(NP_TYPES[dtype])
    a = np.array([info.max, info.min, 7, 9, 100, 3], NP_TYPES[dtype])
    b = np.array([1, 1, 3, 2, 100, 5], NP_TYPES[dtype])
    sa, la = place(a, dtype, "offset")
    sb, lb = place(b, dtype, "strided")
    with np.errstate(all="ignore"):
        for op, ref in [("add", a + b), ("sub", a - b), ("mul", a * b), ("maximum", np.maximum(a, b)),
                        ("minimum", np.minimum(a, b)), ("pow", a ** b)]:
            assert B.to_list(B.binary(op, sa, la, sb, lb, dtype), Layout(a.shape), dtype) == ref.tolist(), op


def test_bool_binary_is_logical():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    sa, la = place(a, D.bool_)
    sb, lb = place(b, D.bool_)
    assert B.to_list(B.binary("add", sa, la, sb, lb, D.bool_), la, D.bool_) == (a + b).tolist()
    assert B.to_list(B.binary("mul", sa, la, sb, lb, D.bool_), la, D.bool_) == (a * b).tolist()


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.bool_])
def test_compare_and_where(dtype):
    a, sa, la = make((5, 4), dtype, "transposed")
    b, sb, lb = make((5, 4), dtype, "broadcast")
    if dtype.is_float:  # put NaNs and ties in
        a[0, 0], a[1, 1] = np.nan, b[1, 1]
        sa, la = place(a, dtype, "transposed")
    for op, fn in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]:
        got = B.to_list(B.compare(op, sa, la, sb, lb, dtype), Layout(a.shape), D.bool_)
        assert got == fn(a, b).ravel().tolist(), op
    c, sc, lc = make((5, 4), D.bool_, "strided")
    got = result(B.where(sc, lc, sa, la, sb, lb, dtype), a.shape, dtype)
    check(got, np.where(c, a, b), dtype if dtype.is_float else D.i64)


# ---- reductions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.bf16, D.i32, D.bool_])
@pytest.mark.parametrize("dims", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
def test_reduce(dtype, dims):
    arr, st, lay = make((3, 4, 5), dtype, "transposed", scale=1.0)
    out_shape = tuple(s for d, s in enumerate(arr.shape) if d not in dims)
    x = torch.from_numpy(arr.astype(np.float64) if dtype.is_float else arr.astype(np.int64))
    for op in ("sum", "prod", "max", "min"):
        got = B.reduce(op, st, lay, dtype, dims)
        out_dtype = D.i64 if op in ("sum", "prod") and not dtype.is_float else dtype
        if op == "sum":
            ref = x.sum(dim=dims)
        elif op == "prod":
            ref = (x.prod(dim=dims[0]) if len(dims) == 1 else x.reshape(-1).prod() if len(dims) == 3
                   else x.prod(2).prod(0))
        else:
            ref = x.amax(dim=dims) if op == "max" else x.amin(dim=dims)
        ref = ref.numpy()
        if dtype.is_float:
            ref = as_dtype(ref, dtype)
        check(result(got, out_shape, out_dtype), ref, out_dtype if out_dtype.is_float else D.i64)
    if len(dims) == 1:
        for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
            got = B.to_list(B.reduce(op, st, lay, dtype, dims), Layout(out_shape), D.i64)
            assert got == fn(arr, axis=dims[0]).ravel().tolist(), op


def test_reduce_nan_ties_and_empty():
    x = np.array([[1.0, 3.0, 3.0, 2.0], [1.0, np.nan, 5.0, np.nan], [0.0, 0.0, 0.0, 0.0]], np.float32)
    st, lay = place(x, D.f32, "offset")
    for op, fn in (("max", np.max), ("min", np.min), ("sum", np.sum)):
        np.testing.assert_array_equal(result(B.reduce(op, st, lay, D.f32, (1,)), (3,), D.f32), fn(x, axis=1))
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        assert B.to_list(B.reduce(op, st, lay, D.f32, (1,)), Layout((3,)), D.i64) == fn(x, axis=1).tolist()
    empty = Layout((3, 0))
    assert B.to_list(B.reduce("sum", st, empty, D.f32, (1,)), Layout((3,)), D.f32) == [0.0] * 3
    assert B.to_list(B.reduce("prod", st, empty, D.f32, (1,)), Layout((3,)), D.f32) == [1.0] * 3
    assert B.to_list(B.reduce("sum", st, empty, D.f32, (0,)), Layout((0,)), D.f32) == []
    for op in ("max", "argmin"):
        with pytest.raises(ShapeError, match="empty"):
            B.reduce(op, st, empty, D.f32, (1,))


def test_reduce_int_sum_is_i64_and_wraps():
    arr = np.full(4, np.iinfo(np.int32).max, np.int32)
    st, lay = place(arr, D.i32)
    assert B.to_list(B.reduce("sum", st, lay, D.i32, (0,)), Layout(()), D.i64) == [int(arr.astype(np.int64).sum())]
    big = np.full(3, 2 ** 62, np.int64)
    st, lay = place(big, D.i64)
    with np.errstate(all="ignore"):
        assert B.to_list(B.reduce("sum", st, lay, D.i64, (0,)), Layout(()), D.i64) == [int(big.sum())]


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.bool_])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cumsum(dtype, dim):
    arr, st, lay = make((3, 4, 5), dtype, "strided", scale=1.0)
    out_dtype = D.i64 if not dtype.is_float else dtype
    ref = np.cumsum(arr.astype(np.float64) if dtype.is_float else arr.astype(np.int64), axis=dim)
    check(result(B.cumsum(st, lay, dtype, dim), arr.shape, out_dtype),
          as_dtype(ref, out_dtype) if dtype.is_float else ref, out_dtype if dtype.is_float else D.i64)


# ---- linear algebra and indexing -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.bf16, D.f64, D.i32])
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 3, 4), (2, 4, 6)), ((2, 1, 3, 0), (2, 1, 0, 4)),
                                    ((0, 3), (3, 2))])
def test_matmul(dtype, shapes):
    sa, sb = shapes
    a, st_a, la = make(sa, dtype, "transposed", scale=1.0)
    b, st_b, lb = make(sb, dtype, "offset", scale=1.0)
    got = result(B.matmul(st_a, la, st_b, lb, dtype), sa[:-1] + sb[-1:], dtype)
    if dtype.is_float:
        ref = as_dtype(np.matmul(a.astype(np.float64), b.astype(np.float64)), dtype)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * 4)
    else:
        np.testing.assert_array_equal(got, np.matmul(a, b))


def test_matmul_broadcast_batch():
    a, st_a, la = make((3, 2, 4), D.f32)
    w, st_w, lw = make((1, 4, 5), D.f32)
    lw = lw.broadcast_to((3, 4, 5))
    check(result(B.matmul(st_a, la, st_w, lw, D.f32), (3, 2, 5), D.f32), a @ w, D.f32)


def test_matmul_broadcasts_batch_dims_itself():
    a, st_a, la = make((2, 1, 3, 4), D.f32)
    b, st_b, lb = make((5, 4, 2), D.f32, "transposed")
    check(result(B.matmul(st_a, la, st_b, lb, D.f32), (2, 5, 3, 2), D.f32), np.matmul(a, b), D.f32)


@pytest.mark.parametrize("fast_dot", ["sumprod", "sum_map"])
def test_both_dot_paths(monkeypatch, fast_dot):
    # math.sumprod exists from Python 3.12 (Pyodide has it); exercise both code paths here.
    from tallow.backends import python_linalg
    monkeypatch.setattr(python_linalg, "_sumprod", (lambda x, y: math.fsum(map(float.__mul__, x, y)))
                        if fast_dot == "sumprod" else None)
    a, st_a, la = make((2, 3, 5), D.f32, "strided")
    b, st_b, lb = make((2, 5, 4), D.f32, "transposed")
    check(result(B.matmul(st_a, la, st_b, lb, D.f32), (2, 3, 4), D.f32), np.matmul(a, b), D.f32)
    x, sx, lx = make((1, 2, 9), D.f32)
    w, sw, lw = make((3, 2, 2), D.f32)
    ref = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), None, 2, 1).numpy()
    check(result(B.conv1d(sx, lx, sw, lw, D.f32, 2, 1, 1, 1), ref.shape, D.f32), ref, D.f32)


def test_where_broadcasts_itself():
    c = np.array([[True], [False]])
    a, sa, la = make((2, 3), D.f32)
    sc, lc = place(c, D.bool_)
    sb, lb = place(np.float32(5.0), D.f32)
    check(result(B.where(sc, lc, sa, la, sb, lb, D.f32), (2, 3), D.f32), np.where(c, a, np.float32(5)), D.f32)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("dtype", [D.f32, D.i64, D.bool_])
def test_index_select(dim, dtype):
    arr, st, lay = make((4, 5, 6), dtype, "transposed")
    ids = np.array([2, 0, -1, 2], np.int64)
    sid, lid = place(ids, D.i64, "strided")
    got = result(B.index_select(st, lay, dtype, sid, lid, dim), np.take(arr, ids, axis=dim).shape, dtype)
    check(got, np.take(arr, ids, axis=dim), dtype if dtype.is_float else D.i64)
    bad, lbad = place(np.array([0, 9]), D.i64)
    with pytest.raises(ShapeError, match="out of range"):
        B.index_select(st, lay, dtype, bad, lbad, dim)


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_and_scatter_add(dim):
    src, st, lay = make((4, 5), D.f32, "transposed")
    ids = RNG.integers(0, src.shape[dim], (3, 4))
    sid, lid = place(ids, D.i64, "transposed")
    got = result(B.gather(st, lay, D.f32, sid, lid, dim), ids.shape, D.f32)
    check(got, torch.gather(torch.from_numpy(src), dim, torch.from_numpy(ids)).numpy(), D.f32)
    vals, sv, lv = make((3, 4), D.f32, "offset")
    got = result(B.scatter_add(st, lay, D.f32, sid, lid, sv, lv, dim), src.shape, D.f32)
    ref = torch.from_numpy(src.copy()).scatter_add(dim, torch.from_numpy(ids), torch.from_numpy(vals)).numpy()
    check(got, ref, D.f32)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2), (3, 1, 2, 4)])
@pytest.mark.parametrize("dtype", [D.f32, D.bf16])
def test_conv1d(stride, padding, dilation, groups, dtype):
    x, sx, lx = make((2, 8, 11), dtype, "transposed", scale=1.0)
    w, sw, lw = make((4, 8 // groups, 3), dtype, "offset", scale=1.0)
    ref = F.conv1d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)), None, stride,
                   padding, dilation, groups)
    got = result(B.conv1d(sx, lx, sw, lw, dtype, stride, padding, dilation, groups), tuple(ref.shape), dtype)
    check(got, as_dtype(ref.numpy(), dtype), dtype)


@pytest.mark.parametrize("stride,padding,dilation,groups", [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 2), 2)])
def test_conv2d(stride, padding, dilation, groups):
    x, sx, lx = make((2, 4, 7, 6), D.f32, "strided", scale=1.0)
    w, sw, lw = make((6, 4 // groups, 3, 2), D.f32, "transposed", scale=1.0)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), None, stride, padding, dilation, groups)
    got = result(B.conv2d(sx, lx, sw, lw, D.f32, stride, padding, dilation, groups), tuple(ref.shape), D.f32)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)


# ---- fused ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "strided"])
def test_softmax_and_log_softmax(dtype, kind):
    arr, st, lay = make((3, 9), dtype, kind, scale=3.0)
    for log, fn in ((False, torch.softmax), (True, torch.log_softmax)):
        got = result(B.softmax(st, lay, dtype, log=log), arr.shape, dtype)
        check(got, as_dtype(fn(torch.from_numpy(arr.astype(np.float64)), -1).numpy(), dtype), dtype)


def test_softmax_extremes():
    x = np.array([[1000.0, 0.0, -1000.0], [-math.inf, 0.0, 1.0], [-math.inf, -math.inf, -math.inf]], np.float32)
    st, lay = place(x, D.f32)
    ref = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(result(B.softmax(st, lay, D.f32), x.shape, D.f32), ref, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_and_rms_norm(dtype):
    x, sx, lx = make((2, 3, 16), dtype, "transposed")
    w, sw, lw = make((16,), dtype, "strided")
    b, sb, lb = make((16,), dtype, "offset")
    xt, wt, bt = (torch.from_numpy(v.astype(np.float64)) for v in (x, w, b))
    got = result(B.layer_norm(sx, lx, sw, lw, sb, lb, dtype, 1e-5), x.shape, dtype)
    check(got, as_dtype(F.layer_norm(xt, (16,), wt, bt, 1e-5).numpy(), dtype), dtype)
    got = result(B.layer_norm(sx, lx, None, None, None, None, dtype, 1e-5), x.shape, dtype)
    check(got, as_dtype(F.layer_norm(xt, (16,), None, None, 1e-5).numpy(), dtype), dtype)
    got = result(B.rms_norm(sx, lx, sw, lw, dtype, 1e-6), x.shape, dtype)
    check(got, as_dtype(F.rms_norm(xt, (16,), wt, 1e-6).numpy(), dtype), dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [D.f32, D.bf16])
def test_rope(interleaved, dtype):
    bsz, h, t, d = 2, 3, 5, 8
    x, sx, lx = make((bsz, h, t, d), dtype, "transposed")
    ang = np.arange(t)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None, :]
    cos, sin = as_dtype(np.cos(ang), dtype), as_dtype(np.sin(ang), dtype)
    sc, lc = place(cos, dtype)
    ss, ls = place(sin, dtype, "offset")
    got = result(B.rope(sx, lx, sc, lc, ss, ls, dtype, interleaved), x.shape, dtype)
    # Reference: complex multiplication by e^{i angle} (torch), pairs chosen per form.
    xt = torch.from_numpy(x.astype(np.float64))
    if interleaved:
        pairs = torch.complex(xt[..., 0::2], xt[..., 1::2])
    else:
        pairs = torch.complex(xt[..., : d // 2], xt[..., d // 2:])
    rot = pairs * torch.complex(torch.from_numpy(cos.astype(np.float64)), torch.from_numpy(sin.astype(np.float64)))
    ref = torch.stack([rot.real, rot.imag], -1).flatten(-2) if interleaved else torch.cat([rot.real, rot.imag], -1)
    check(got, as_dtype(ref.numpy(), dtype), dtype)


@pytest.mark.parametrize("tq,tk,causal,with_mask", [(4, 4, True, False), (2, 6, True, True), (5, 3, False, True),
                                                     (1, 7, True, False), (3, 3, False, False)])
@pytest.mark.parametrize("dtype", [D.f32, D.f16])
def test_attention(tq, tk, causal, with_mask, dtype):
    b, h, d, dv = 2, 2, 8, 6
    q, sq, lq = make((b, h, tq, d), dtype, "transposed", scale=1.0)
    k, sk, lk = make((b, h, tk, d), dtype, "strided", scale=1.0)
    v, sv, lv = make((b, h, tk, dv), dtype, "offset", scale=1.0)
    scale = 1 / math.sqrt(d)
    mask_t = None
    sm = lm = None
    if with_mask:
        m = as_dtype(RNG.standard_normal((1, 1, tq, tk)), dtype)
        sm, lm = place(m, dtype)
        lm = lm.broadcast_to((b, h, tq, tk))
        mask_t = torch.from_numpy(m.astype(np.float64))
    got = result(B.attention(sq, lq, sk, lk, sv, lv, sm, lm, dtype, scale, causal), (b, h, tq, dv), dtype)
    # Reference: torch SDPA with a boolean/additive mask encoding "key j > i + (tk - tq) is masked".
    attn_mask = torch.zeros(tq, tk, dtype=torch.float64)
    if causal:
        banned = torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1)
        attn_mask = attn_mask.masked_fill(banned, -math.inf)
    if mask_t is not None:
        attn_mask = attn_mask + mask_t
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(t.astype(np.float64)) for t in (q, k, v)),
                                         attn_mask=attn_mask, scale=scale)
    check(got, as_dtype(ref.numpy(), dtype), dtype)


# ---- Pyodide constraint ---------------------------------------------------------------------------
def test_backend_imports_and_runs_without_numpy():
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from tallow.backends.python_backend import PythonBackend\n"
        "from tallow.layout import Layout\nfrom tallow import dtypes as D\n"
        "b = PythonBackend(); s = b.from_list([1.0, 2.0, 3.0, 4.0], D.f32)\n"
        "out = b.matmul(s, Layout((2, 2)), s, Layout((2, 2)).permute((1, 0)), D.f32)\n"
        "print(b.to_list(out, Layout((4,)), D.f32))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[5.0, 11.0, 11.0, 25.0]"


# ---- quantised weights (GGUF blocks made and decoded by the `gguf` library) -------------------------------
@pytest.mark.parametrize("qname", ["q4_0", "q4_1", "q8_0"])
def test_quantised_dequantize_qmatmul_and_row_select(qname):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    from tallow.quant import quant_dtype
    qtype = getattr(gguf.GGMLQuantizationType, qname.upper())
    qd = quant_dtype(qname)
    n, k = 6, 64
    w = RNG.standard_normal((n, k)).astype(np.float32)
    raw = quantize(w, qtype).tobytes()
    ref_w = dequantize(np.frombuffer(raw, np.uint8).reshape(n, -1), qtype).reshape(n, k)
    st = B.from_bytes(raw, qd)
    assert B.to_bytes(st, Layout((n, k)), qd) == raw
    np.testing.assert_array_equal(result(B.dequantize(st, qd, n * k, D.f32), (n, k), D.f32), ref_w)
    check(result(B.dequantize(st, qd, n * k, D.bf16), (n, k), D.bf16), bf16_round(ref_w), D.bf16)
    x, sx, lx = make((3, k), D.f32, "transposed", scale=1.0)
    got = result(B.qmatmul(sx, lx, D.f32, st, qd, n, k), (3, n), D.f32)
    np.testing.assert_allclose(got, x.astype(np.float64) @ ref_w.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    ids, lid = place(np.array([5, 0, -1, 2]), D.i64)
    got = result(B.index_select(st, Layout((n, k)), qd, ids, lid, 0), (4, k), D.f32)
    np.testing.assert_array_equal(got, ref_w[[5, 0, -1, 2]])
    # rows 2..5 of the matrix as a narrowed (offset) layout: its rows 1 and 3 are rows 3 and 5
    sid, lid = place(np.array([1, 3]), D.i64)
    got = result(B.index_select(st, Layout((n, k)).narrow(0, 2, 4), qd, sid, lid, 0), (2, k), D.f32)
    np.testing.assert_array_equal(got, ref_w[[3, 5]])
