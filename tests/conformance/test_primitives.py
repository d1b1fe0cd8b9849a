"""The backend contract called directly, on every device: each primitive of
tallow.backends.base.Backend with (storage, Layout) pairs over contiguous, offset,
transposed, strided and broadcast layouts, zero-size and 0-d shapes, for several dtypes,
with IEEE corner cases and integer wrap-around. References are numpy (f32/f16/ints/bool),
torch (bf16, and the activations / conv / attention numpy lacks) and the gguf package.

What a device truly cannot do is a row of device_limits.py (NO_DTYPE, NARROW_INTS): the test
then expects exactly that UnsupportedError on that device, never a skip. The GPU kernels' own
paths (larger, permuted, batched inputs) are test_primitive_paths.py; tests of one backend's
internals (wgpu's buffer pool and limits, the pure-Python dot paths) stay in that backend's file.
"""
import math

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.operand import Operand, QuantWeight, Rotary
from tallow.backends.specs import AttentionSpec, ConvSpec
from tallow.errors import FormatError, ShapeError
from tallow.layout import Layout

from device_limits import exact_ints, int_range, refused
from storage_io import assert_quantised_product_close

torch = pytest.importorskip("torch")
F = torch.nn.functional

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


def place(B, arr, dtype, kind="contiguous"):
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


def make(B, shape, dtype, kind="contiguous", scale=2.0):
    arr = random_values(shape, dtype, scale)
    if kind == "broadcast" and arr.ndim >= 1 and arr.shape[0] > 0:
        arr = np.broadcast_to(arr[:1], arr.shape).copy()
    st, lay = place(B, arr, dtype, kind)
    return arr, st, lay


def result(B, storage, shape, dtype):
    return np.array(B.to_list(storage, Layout(shape), dtype),
                    dtype=np.float64 if dtype.is_float else None).reshape(shape)


def check(got, ref, dtype):
    ref = np.asarray(ref)
    if dtype.is_float:
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, ref.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, ref)


# ---- memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f64, D.f32, D.f16, D.i64, D.i32, D.i8, D.u8, D.u32, D.bool_])
def test_bytes_roundtrip_matches_numpy(device, dtype):
    B = device.backend
    if refused(device, dtype):
        return
    arr = random_values((3, 5), dtype)
    raw = arr.astype(np.dtype(NP_TYPES[dtype]).newbyteorder("<")).tobytes()
    st = B.from_bytes(raw, dtype)
    assert B.to_list(st, Layout((15,)), dtype) == arr.ravel().tolist()
    assert B.to_bytes(st, Layout((15,)), dtype) == raw
    # a transposed view serialises in row-major order
    assert B.to_bytes(st, Layout((3, 5)).permute((1, 0)), dtype) == np.ascontiguousarray(arr.T).astype(
        np.dtype(NP_TYPES[dtype]).newbyteorder("<")).tobytes()


def test_bf16_bytes_and_rounding_match_torch(device):
    B = device.backend
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
def test_f16_rounding_matches_numpy_including_overflow(device):
    B = device.backend
    # 2049.0000001 and -1568.5000001 are ties once rounded to f32 first: one rounding from the double is numpy's
    x = np.concatenate([RNG.standard_normal(200) * 1000, [65504.0, 65519.0, 65520.0, 7e4, -7e4, 6e-8, 1e-9, math.inf,
                                                          2049.0000001, -1568.5000001]])
    got = B.to_list(B.from_list(x.tolist(), D.f16), Layout((len(x),)), D.f16)
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float64))


def test_from_bytes_rejects_partial_elements(device):
    B = device.backend
    with pytest.raises(FormatError, match="f32"):
        B.from_bytes(b"\x00" * 6, D.f32)


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.i64, D.bool_])
def test_full_and_arange(device, dtype):
    B = device.backend
    assert B.to_list(B.full(4, 3, dtype), Layout((4,)), dtype) == np.full(4, 3, NP_TYPES[dtype]).tolist()
    assert B.to_list(B.full(0, 3, dtype), Layout((0,)), dtype) == []
    if dtype is not D.bool_:
        ref = (2 + 3 * np.arange(6, dtype=np.float64)).astype(NP_TYPES[dtype])
        assert B.to_list(B.arange(2, 3, 6, dtype), Layout((6,)), dtype) == ref.tolist()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4), (4, 1, 9)])
def test_copy_reads_every_layout(device, kind, shape):
    B = device.backend
    arr, st, lay = make(B, shape, D.f32, kind)
    check(result(B, B.copy(st, lay, D.f32), shape, D.f32), arr, D.f32)


def test_copy_with_negative_stride(device):
    B = device.backend
    st = B.from_list(list(range(12)), D.i32)
    lay = Layout((3, 4), (4, -1), 3)  # each row reversed
    assert (B.to_list(B.copy(st, lay, D.i32), Layout((3, 4)), D.i32)
            == np.arange(12).reshape(3, 4)[:, ::-1].ravel().tolist())


def test_assign_into_strided_view(device):
    B = device.backend
    dst = B.from_list([0.0] * 20, D.f32)
    arr, src, ls = make(B, (3, 4), D.f32, "transposed")
    target = Layout((3, 4), (5, 1), 1)  # a (3, 4) window of a (4, 5) buffer
    B.assign(dst, target, src, ls, D.f32)
    ref = np.zeros(20, np.float32)
    view = np.lib.stride_tricks.as_strided(ref[1:], (3, 4), (20, 4))
    view[...] = arr
    check(result(B, dst, (20,), D.f32), ref, D.f32)
    dst2 = B.from_list([0] * 12, D.i32)
    arr2, src2, ls2 = make(B, (4, 3), D.i32)
    B.assign(dst2, Layout((4, 3), (1, 4)), src2, ls2, D.i32)  # transposed destination
    assert B.to_list(dst2, Layout((12,)), D.i32) == arr2.T.ravel().tolist()


@pytest.mark.parametrize("src,dst", [(D.f32, D.i32), (D.f32, D.f16), (D.f32, D.bf16), (D.f16, D.f32), (D.i64, D.i8),
                                     (D.i32, D.f32), (D.f32, D.bool_), (D.bool_, D.f32), (D.i32, D.u8), (D.f64, D.f32)])
def test_cast_matches_numpy_and_torch(device, src, dst):
    B = device.backend
    if refused(device, src, dst):
        return
    arr, st, lay = make(B, (4, 6), src, "transposed", scale=100.0)
    if src.is_int:
        arr = (arr.astype(np.int64) * 7).astype(NP_TYPES[src])
        st, lay = place(B, arr, src, "transposed")
    got = result(B, B.cast(st, lay, src, dst), (4, 6), dst)
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
def test_unary_float(device, op, dtype):
    B = device.backend
    kind = KINDS[sorted(UNARY_TORCH).index(op) % len(KINDS)]
    arr, st, lay = make(B, (3, 7), dtype, kind)
    if op in ("log", "sqrt", "rsqrt"):
        arr = as_dtype(np.abs(arr) + 0.1, dtype)
        st, lay = place(B, arr, dtype, kind)
    got = result(B, B.unary(op, st, lay, dtype), arr.shape, dtype)
    # Reference: torch in f64 on the same (dtype-exact) inputs, rounded to the dtype.
    ref = UNARY_TORCH[op](torch.from_numpy(arr.astype(np.float64)))
    ref = ref.to({D.f32: torch.float32, D.f16: torch.float16, D.bf16: torch.bfloat16}[dtype]).double().numpy()
    check(got, ref, dtype)


def test_unary_ieee_corner_cases_match_numpy(device):
    B = device.backend
    x = np.array([0.0, -0.0, -1.0, 1000.0, -1000.0, math.inf, -math.inf, math.nan, 0.5, 1.5, 2.5, -2.5], np.float32)
    st, lay = place(B, x, D.f32)
    with np.errstate(all="ignore"):
        refs = {
            "exp": np.exp(x), "log": np.log(x), "sqrt": np.sqrt(x), "rsqrt": 1 / np.sqrt(x), "sin": np.sin(x),
            "reciprocal": 1 / x, "floor": np.floor(x), "ceil": np.ceil(x), "round": np.round(x), "sign": np.sign(x),
            "relu": np.maximum(x, 0), "tanh": np.tanh(x), "abs": np.abs(x),
            "sigmoid": torch.sigmoid(torch.from_numpy(x)).numpy(),
        }
    wrong = {}
    for op, ref in refs.items():
        with np.errstate(all="ignore"):  # the cpu backend is numpy: it warns where it gives inf/nan
            got = result(B, B.unary(op, st, lay, D.f32), x.shape, D.f32)
        if not np.allclose(got, ref, rtol=2e-6, atol=0, equal_nan=True):
            wrong[op] = [(v, g, r) for v, g, r in zip(x.tolist(), got.tolist(), ref.tolist())
                         if not np.allclose(g, r, rtol=2e-6, atol=0, equal_nan=True)]
    assert not wrong, wrong
    assert B.to_list(B.unary("logical_not", st, lay, D.f32), lay, D.bool_) == np.logical_not(x).tolist()


@pytest.mark.parametrize("dtype", [D.i8, D.i32, D.i64, D.u8])
def test_unary_int_wraps_like_numpy(device, dtype):
    B = device.backend
    lo, hi = int_range(device, dtype)
    arr = np.array([lo, hi, 0, 3, -5 if dtype.kind == "i" else 5, 100, 17], NP_TYPES[dtype])
    st, lay = place(B, arr, dtype, "strided")
    with np.errstate(all="ignore"):
        for op, arg, ref in [("neg", None, -arr), ("abs", None, np.abs(arr)), ("square", None, arr * arr),
                             ("sign", None, np.sign(arr)), ("relu", None, np.maximum(arr, 0)), ("round", None, arr),
                             ("pow_scalar", 3, arr ** 3), ("clamp", (2, 90), np.clip(arr, 2, 90)),
                             ("affine", (3, 4), arr * np.array(3, arr.dtype) + np.array(4, arr.dtype))]:
            exact_ints(device, dtype, ref,
                       lambda op=op, arg=arg: B.to_list(B.unary(op, st, lay, dtype, arg), Layout(arr.shape), dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_with_arguments_float(device, dtype):
    B = device.backend
    arr, st, lay = make(B, (4, 5), dtype, "transposed")
    for op, arg, ref in [("clamp", (-0.5, 0.7), np.clip(arr, -0.5, 0.7)), ("clamp", (None, 0.7), np.minimum(arr, 0.7)),
                         ("clamp", (0.1, None), np.maximum(arr, 0.1)), ("affine", (1.5, -0.25), arr * 1.5 - 0.25),
                         ("pow_scalar", 3.0, arr.astype(np.float64) ** 3),
                         ("pow_scalar", 0.5, np.sqrt(np.abs(arr.astype(np.float64))))]:
        src_st, src_lay = (place(B, np.abs(arr), dtype, "transposed") if arg == 0.5 else (st, lay))
        got = result(B, B.unary(op, src_st, src_lay, dtype, arg), arr.shape, dtype)
        check(got, as_dtype(ref, dtype).astype(np.float64), dtype)


BINARY_TORCH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
                "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(BINARY_TORCH))
@pytest.mark.parametrize("kinds", [("contiguous", "broadcast"), ("transposed", "offset"), ("strided", "transposed")])
def test_binary_float(device, op, dtype, kinds):
    B = device.backend
    a, sa, la = make(B, (4, 6), dtype, kinds[0])
    b, sb, lb = make(B, (4, 6), dtype, kinds[1])
    if op == "pow":
        a = as_dtype(np.abs(a) + 0.5, dtype)
        sa, la = place(B, a, dtype, kinds[0])
    got = result(B, B.binary(op, sa, la, sb, lb, dtype), a.shape, dtype)
    ref = BINARY_TORCH[op](torch.from_numpy(a.astype(np.float64)), torch.from_numpy(b.astype(np.float64)))
    ref = ref.to({D.f32: torch.float32, D.f16: torch.float16, D.bf16: torch.bfloat16}[dtype]).double().numpy()
    check(got, ref, dtype)


def test_binary_ieee_corner_cases(device):
    B = device.backend
    a = np.array([1.0, -1.0, 0.0, math.nan, 2.0, -8.0, 0.0, 1e30, math.inf], np.float32)
    b = np.array([0.0, 0.0, 0.0, 1.0, math.nan, 0.5, -1.0, 1e30, math.inf], np.float32)
    sa, la = place(B, a, D.f32)
    sb, lb = place(B, b, D.f32)
    with np.errstate(all="ignore"):
        refs = {"div": a / b, "pow": np.power(a, b), "maximum": np.maximum(a, b), "minimum": np.minimum(a, b),
                "mul": a * b, "sub": a - b}
    wrong = {}
    for op, ref in refs.items():
        got = result(B, B.binary(op, sa, la, sb, lb, D.f32), a.shape, D.f32)
        bad = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
        if bad.any():
            wrong[op] = list(zip(a[bad].tolist(), b[bad].tolist(), got[bad].tolist(), ref[bad].tolist()))
    assert not wrong, wrong


@pytest.mark.parametrize("dtype", [D.i8, D.i32, D.i64, D.u8, D.u32])
def test_binary_int_wraps_like_numpy(device, dtype):
    B = device.backend
    lo, hi = int_range(device, dtype)
    a = np.array([hi, lo, 7, 9, 100, 3], NP_TYPES[dtype])
    b = np.array([1, 1, 3, 2, 100, 5], NP_TYPES[dtype])
    sa, la = place(B, a, dtype, "offset")
    sb, lb = place(B, b, dtype, "strided")
    with np.errstate(all="ignore"):
        for op, ref in [("add", a + b), ("sub", a - b), ("mul", a * b), ("maximum", np.maximum(a, b)),
                        ("minimum", np.minimum(a, b)), ("pow", a ** b)]:
            exact_ints(device, dtype, ref,
                       lambda op=op: B.to_list(B.binary(op, sa, la, sb, lb, dtype), Layout(a.shape), dtype))


def test_bool_binary_is_logical(device):
    B = device.backend
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    sa, la = place(B, a, D.bool_)
    sb, lb = place(B, b, D.bool_)
    assert B.to_list(B.binary("add", sa, la, sb, lb, D.bool_), la, D.bool_) == (a + b).tolist()
    assert B.to_list(B.binary("mul", sa, la, sb, lb, D.bool_), la, D.bool_) == (a * b).tolist()


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.bool_])
def test_compare_and_where(device, dtype):
    B = device.backend
    a, sa, la = make(B, (5, 4), dtype, "transposed")
    b, sb, lb = make(B, (5, 4), dtype, "broadcast")
    if dtype.is_float:  # put NaNs and ties in
        a[0, 0], a[1, 1] = np.nan, b[1, 1]
        sa, la = place(B, a, dtype, "transposed")
    for op, fn in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]:
        got = B.to_list(B.compare(op, sa, la, sb, lb, dtype), Layout(a.shape), D.bool_)
        assert got == fn(a, b).ravel().tolist(), op
    c, sc, lc = make(B, (5, 4), D.bool_, "strided")
    got = result(B, B.where(Operand(sc, lc), Operand(sa, la), Operand(sb, lb), dtype), a.shape, dtype)
    check(got, np.where(c, a, b), dtype if dtype.is_float else D.i64)


# ---- reductions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.bf16, D.i32, D.bool_])
@pytest.mark.parametrize("dims", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
def test_reduce(device, dtype, dims):
    B = device.backend
    arr, st, lay = make(B, (3, 4, 5), dtype, "transposed", scale=1.0)
    out_shape = tuple(s for d, s in enumerate(arr.shape) if d not in dims)
    x = torch.from_numpy(arr.astype(np.float64) if dtype.is_float else arr.astype(np.int64))
    for op in ("sum", "prod", "max", "min"):
        out_dtype = D.i64 if op in ("sum", "prod") and not dtype.is_float else dtype
        if op == "sum":
            ref = x.sum(dim=dims)
        elif op == "prod":
            ref = (x.prod(dim=dims[0]) if len(dims) == 1 else x.reshape(-1).prod() if len(dims) == 3
                   else x.prod(2).prod(0))
        else:
            ref = x.amax(dim=dims) if op == "max" else x.amin(dim=dims)
        ref = ref.numpy()
        if not dtype.is_float:
            exact_ints(device, out_dtype, ref,
                       lambda op=op, od=out_dtype: B.to_list(B.reduce(op, st, lay, dtype, dims), Layout(out_shape), od))
            continue
        check(result(B, B.reduce(op, st, lay, dtype, dims), out_shape, out_dtype), as_dtype(ref, dtype), out_dtype)
    if len(dims) == 1:
        for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
            got = B.to_list(B.reduce(op, st, lay, dtype, dims), Layout(out_shape), D.i64)
            assert got == fn(arr, axis=dims[0]).ravel().tolist(), op


def test_reduce_nan_ties_and_empty(device):
    B = device.backend
    x = np.array([[1.0, 3.0, 3.0, 2.0], [1.0, np.nan, 5.0, np.nan], [0.0, 0.0, 0.0, 0.0]], np.float32)
    st, lay = place(B, x, D.f32, "offset")
    for op, fn in (("max", np.max), ("min", np.min), ("sum", np.sum)):
        np.testing.assert_array_equal(result(B, B.reduce(op, st, lay, D.f32, (1,)), (3,), D.f32), fn(x, axis=1))
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        assert B.to_list(B.reduce(op, st, lay, D.f32, (1,)), Layout((3,)), D.i64) == fn(x, axis=1).tolist()
    empty = Layout((3, 0))
    assert B.to_list(B.reduce("sum", st, empty, D.f32, (1,)), Layout((3,)), D.f32) == [0.0] * 3
    assert B.to_list(B.reduce("prod", st, empty, D.f32, (1,)), Layout((3,)), D.f32) == [1.0] * 3
    assert B.to_list(B.reduce("sum", st, empty, D.f32, (0,)), Layout((0,)), D.f32) == []
    for op in ("max", "argmin"):
        with pytest.raises(ShapeError, match="empty"):
            B.reduce(op, st, empty, D.f32, (1,))


def test_reduce_int_sum_is_i64_and_wraps(device):
    B = device.backend
    arr = np.full(4, np.iinfo(np.int32).max, np.int32)
    st, lay = place(B, arr, D.i32)
    exact_ints(device, D.i64, arr.astype(np.int64).sum(),
               lambda: B.to_list(B.reduce("sum", st, lay, D.i32, (0,)), Layout(()), D.i64))
    exact_ints(device, D.i64, np.cumsum(arr.astype(np.int64)), lambda: B.to_list(B.cumsum(st, lay, D.i32, 0), lay, D.i64))
    big = np.full(3, int_range(device, D.i64)[1] // 2 + 1, np.int64)  # the sum wraps in the device's i64
    st, lay = place(B, big, D.i64)
    with np.errstate(all="ignore"):
        exact_ints(device, D.i64, big.sum(), lambda: B.to_list(B.reduce("sum", st, lay, D.i64, (0,)), Layout(()), D.i64))


@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.i32, D.bool_])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cumsum(device, dtype, dim):
    B = device.backend
    arr, st, lay = make(B, (3, 4, 5), dtype, "strided", scale=1.0)
    out_dtype = D.i64 if not dtype.is_float else dtype
    ref = np.cumsum(arr.astype(np.float64) if dtype.is_float else arr.astype(np.int64), axis=dim)
    check(result(B, B.cumsum(st, lay, dtype, dim), arr.shape, out_dtype),
          as_dtype(ref, out_dtype) if dtype.is_float else ref, out_dtype if dtype.is_float else D.i64)


# ---- linear algebra and indexing -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D.f32, D.f16, D.bf16, D.f64, D.i32])
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 3, 4), (2, 4, 6)), ((2, 1, 3, 0), (2, 1, 0, 4)),
                                    ((0, 3), (3, 2))])
def test_matmul(device, dtype, shapes):
    B = device.backend
    if refused(device, dtype):
        return
    sa, sb = shapes
    a, st_a, la = make(B, sa, dtype, "transposed", scale=1.0)
    b, st_b, lb = make(B, sb, dtype, "offset", scale=1.0)
    got = result(B, B.matmul(Operand(st_a, la), Operand(st_b, lb), dtype), sa[:-1] + sb[-1:], dtype)
    if dtype.is_float:
        ref = as_dtype(np.matmul(a.astype(np.float64), b.astype(np.float64)), dtype)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * 4)
    else:
        np.testing.assert_array_equal(got, np.matmul(a, b))


def test_matmul_broadcast_batch(device):
    B = device.backend
    a, st_a, la = make(B, (3, 2, 4), D.f32)
    w, st_w, lw = make(B, (1, 4, 5), D.f32)
    lw = lw.broadcast_to((3, 4, 5))
    check(result(B, B.matmul(Operand(st_a, la), Operand(st_w, lw), D.f32), (3, 2, 5), D.f32), a @ w, D.f32)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("dtype", [D.f32, D.i64, D.bool_])
def test_index_select(device, dim, dtype):
    """Ids arrive in [0, size): the front end checks them once for every backend (core/index_check.py;
    test_ops.py::test_ids_out_of_range has the IndexRangeError on every device)."""
    B = device.backend
    arr, st, lay = make(B, (4, 5, 6), dtype, "transposed")
    ids = np.array([2, 0, 3, 2], np.int64)
    sid, lid = place(B, ids, D.i64, "strided")
    got = result(B, B.index_select(Operand(st, lay), Operand(sid, lid), dtype, dim), np.take(arr, ids, axis=dim).shape, dtype)
    check(got, np.take(arr, ids, axis=dim), dtype if dtype.is_float else D.i64)


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_and_scatter_add(device, dim):
    B = device.backend
    src, st, lay = make(B, (4, 5), D.f32, "transposed")
    ids = RNG.integers(0, src.shape[dim], (3, 4))
    sid, lid = place(B, ids, D.i64, "transposed")
    got = result(B, B.gather(Operand(st, lay), Operand(sid, lid), D.f32, dim), ids.shape, D.f32)
    check(got, torch.gather(torch.from_numpy(src), dim, torch.from_numpy(ids)).numpy(), D.f32)
    vals, sv, lv = make(B, (3, 4), D.f32, "offset")
    got = result(B, B.scatter_add(Operand(st, lay), Operand(sid, lid), Operand(sv, lv), D.f32, dim), src.shape, D.f32)
    ref = torch.from_numpy(src.copy()).scatter_add(dim, torch.from_numpy(ids), torch.from_numpy(vals)).numpy()
    check(got, ref, D.f32)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2), (3, 1, 2, 4)])
@pytest.mark.parametrize("dtype", [D.f32, D.bf16])
def test_conv1d(device, stride, padding, dilation, groups, dtype):
    B = device.backend
    x, sx, lx = make(B, (2, 8, 11), dtype, "transposed", scale=1.0)
    w, sw, lw = make(B, (4, 8 // groups, 3), dtype, "offset", scale=1.0)
    ref = F.conv1d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)), None, stride,
                   padding, dilation, groups)
    got = result(B, B.conv1d(Operand(sx, lx), Operand(sw, lw), dtype, ConvSpec(stride, padding, dilation, groups)), tuple(ref.shape), dtype)
    if dtype != D.f32:
        return check(got, as_dtype(ref.numpy(), dtype), dtype)
    # An f32 sum of n terms may be off by n * 2^-24 * sum|terms| (and an output that cancels to
    # near 0 has no relative accuracy): the bound, from the terms' magnitudes, plus TOL's rtol.
    magnitude = F.conv1d(torch.from_numpy(np.abs(x).astype(np.float64)), torch.from_numpy(np.abs(w).astype(np.float64)),
                         None, stride, padding, dilation, groups).numpy()
    terms = (8 // groups) * 3
    bound = TOL[D.f32][0] * np.abs(ref.numpy()) + terms * 2.0 ** -24 * magnitude + 1e-30
    assert np.all(np.abs(got - ref.numpy()) <= bound), np.max(np.abs(got - ref.numpy()) / bound)


@pytest.mark.parametrize("stride,padding,dilation,groups", [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 2), 2)])
def test_conv2d(device, stride, padding, dilation, groups):
    B = device.backend
    x, sx, lx = make(B, (2, 4, 7, 6), D.f32, "strided", scale=1.0)
    w, sw, lw = make(B, (6, 4 // groups, 3, 2), D.f32, "transposed", scale=1.0)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), None, stride, padding, dilation, groups)
    got = result(B, B.conv2d(Operand(sx, lx), Operand(sw, lw), D.f32, ConvSpec(stride, padding, dilation, groups)), tuple(ref.shape), D.f32)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)


# ---- fused ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "strided"])
def test_softmax_and_log_softmax(device, dtype, kind):
    B = device.backend
    arr, st, lay = make(B, (3, 9), dtype, kind, scale=3.0)
    for log, fn in ((False, torch.softmax), (True, torch.log_softmax)):
        got = result(B, B.softmax(st, lay, dtype, log=log), arr.shape, dtype)
        check(got, as_dtype(fn(torch.from_numpy(arr.astype(np.float64)), -1).numpy(), dtype), dtype)


def test_softmax_extremes(device):
    B = device.backend
    x = np.array([[1000.0, 0.0, -1000.0], [-math.inf, 0.0, 1.0], [-math.inf, -math.inf, -math.inf]], np.float32)
    st, lay = place(B, x, D.f32)
    ref = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(result(B, B.softmax(st, lay, D.f32), x.shape, D.f32), ref, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_and_rms_norm(device, dtype):
    B = device.backend
    x, sx, lx = make(B, (2, 3, 16), dtype, "transposed")
    w, sw, lw = make(B, (16,), dtype, "strided")
    b, sb, lb = make(B, (16,), dtype, "offset")
    xt, wt, bt = (torch.from_numpy(v.astype(np.float64)) for v in (x, w, b))
    got = result(B, B.layer_norm(Operand(sx, lx), Operand(sw, lw), Operand(sb, lb), dtype, 1e-5), x.shape, dtype)
    check(got, as_dtype(F.layer_norm(xt, (16,), wt, bt, 1e-5).numpy(), dtype), dtype)
    got = result(B, B.layer_norm(Operand(sx, lx), None, None, dtype, 1e-5), x.shape, dtype)
    check(got, as_dtype(F.layer_norm(xt, (16,), None, None, 1e-5).numpy(), dtype), dtype)
    got = result(B, B.rms_norm(Operand(sx, lx), Operand(sw, lw), dtype, 1e-6), x.shape, dtype)
    check(got, as_dtype(F.rms_norm(xt, (16,), wt, 1e-6).numpy(), dtype), dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [D.f32, D.bf16])
def test_rope(device, interleaved, dtype):
    B = device.backend
    bsz, h, t, d = 2, 3, 5, 8
    x, sx, lx = make(B, (bsz, h, t, d), dtype, "transposed")
    ang = np.arange(t)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None, :]
    cos, sin = as_dtype(np.cos(ang), dtype), as_dtype(np.sin(ang), dtype)
    sc, lc = place(B, cos, dtype)
    ss, ls = place(B, sin, dtype, "offset")
    got = result(B, B.rope(Operand(sx, lx), Rotary(Operand(sc, lc), Operand(ss, ls), interleaved), dtype), x.shape, dtype)
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
def test_attention(device, tq, tk, causal, with_mask, dtype):
    B = device.backend
    b, h, d, dv = 2, 2, 8, 6
    q, sq, lq = make(B, (b, h, tq, d), dtype, "transposed", scale=1.0)
    k, sk, lk = make(B, (b, h, tk, d), dtype, "strided", scale=1.0)
    v, sv, lv = make(B, (b, h, tk, dv), dtype, "offset", scale=1.0)
    scale = 1 / math.sqrt(d)
    mask_t = None
    sm = lm = None
    if with_mask:
        m = as_dtype(RNG.standard_normal((1, 1, tq, tk)), dtype)
        sm, lm = place(B, m, dtype)
        lm = lm.broadcast_to((b, h, tq, tk))
        mask_t = torch.from_numpy(m.astype(np.float64))
    got = result(B, B.attention(Operand(sq, lq), Operand(sk, lk), Operand(sv, lv), None if sm is None else Operand(sm, lm), dtype,
                                AttentionSpec(scale, causal)), (b, h, tq, dv), dtype)
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


# ---- quantised weights (GGUF blocks made and decoded by the `gguf` library) -------------------------------
@pytest.mark.parametrize("qname", ["q4_0", "q4_1", "q8_0"])
def test_quantised_dequantize_qmatmul_and_row_select(device, qname):
    B = device.backend
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
    np.testing.assert_array_equal(result(B, B.dequantize(st, qd, n * k, D.f32), (n, k), D.f32), ref_w)
    check(result(B, B.dequantize(st, qd, n * k, D.bf16), (n, k), D.bf16), bf16_round(ref_w), D.bf16)
    x, sx, lx = make(B, (3, k), D.f32, "transposed", scale=1.0)
    got = result(B, B.qmatmul(Operand(sx, lx), QuantWeight(st, qd, n, k), D.f32), (3, n), D.f32)
    assert_quantised_product_close(got, x, ref_w)
    ids, lid = place(B, np.array([5, 0, n - 1, 2]), D.i64)
    got = result(B, B.index_select(Operand(st, Layout((n, k))), Operand(ids, lid), qd, 0), (4, k), D.f32)
    np.testing.assert_array_equal(got, ref_w[[5, 0, n - 1, 2]])
