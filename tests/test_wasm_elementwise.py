"""kernels.wasm's row, conversion, lookup and strided kernels (tallow.backends.wasm.elementwise_ir)
under wasmtime against torch and numpy: conv1d as im2col + GEMM (Whisper's two convolutions),
softmax over rows with a scale and a causal mask, LayerNorm rows, f16 <-> f32 rows (bit-exact
with numpy), row lookups, and strided unary / binary ops and last-dim reductions on views
(transposed, broadcast, offset), with sizes that are not multiples of the 16 lanes."""
import numpy as np
import pytest

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
torch = pytest.importorskip("torch")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.program import BINARY_OPS, REDUCE_OPS, UNARY_OPS, conv1d_scratch_floats  # noqa: E402
from tallow.backends.wasm.program import STRIDED_DIMS as MAX_DIMS  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402
from tallow.layout import Layout, kernel_meta  # noqa: E402

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)


@pytest.fixture(scope="module")
def wasm():
    return Kernels(build.build())


def _close(got, want, rel=1e-5, atol=1e-6):
    want = np.asarray(want, np.float64)
    err = np.abs(got - want)
    assert np.all(err <= rel * np.abs(want) + atol), err.max()


@pytest.mark.parametrize("c_in,c_out,t_in,stride,bias", [(80, 24, 301, 1, True), (24, 20, 301, 2, True),
                                                         (7, 5, 9, 2, False), (3, 9, 1, 1, True)])
def test_conv1d_matches_torch(wasm, c_in, c_out, t_in, stride, bias):
    """Whisper's convolutions (k = 3, padding 1, stride 1 then 2) on odd lengths, and a 1-long signal."""
    rng = np.random.default_rng(c_in + t_in + stride)
    x = rng.standard_normal((c_in, t_in)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in, 3)).astype(np.float32)
    bv = rng.standard_normal(c_out).astype(np.float32) if bias else None
    want = torch.nn.functional.conv1d(torch.from_numpy(x)[None].double(), torch.from_numpy(w).double(),
                                      None if bv is None else torch.from_numpy(bv).double(),
                                      stride=stride, padding=1)[0].numpy()
    t_out = want.shape[1]
    out = wasm.alloc(c_out * t_out * 4)
    scratch = wasm.alloc(conv1d_scratch_floats(c_in, t_out, 3) * 4)
    wasm("conv1d_f32", wasm.put(x), c_in, t_in, wasm.put(w), c_out, 3, stride, 1, 0 if bv is None else wasm.put(bv),
         out, scratch)
    got = wasm.get(out, (c_out, t_out), np.float32)
    bound = 2e-6 * np.sqrt(3 * c_in) * torch.nn.functional.conv1d(
        torch.from_numpy(np.abs(x))[None].double(), torch.from_numpy(np.abs(w)).double(), stride=stride,
        padding=1)[0].numpy() + 1e-6
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("causal", [-1, 0, 3])
def test_softmax_rows_scales_and_masks(wasm, causal):
    """Rows of n = 37 read from rows of ld = 41 (a view), times a scale; causal >= 0: row r sees the
    columns up to r + causal, as sdpa's is_causal does after `causal` cached keys."""
    rng = np.random.default_rng(causal + 5)
    rows, n, ld, scale = 19, 37, 41, 0.125
    x = (rng.standard_normal((rows, ld)) * 6).astype(np.float32)
    out = wasm.alloc(rows * n * 4)
    wasm("softmax_rows", wasm.put(x), rows, n, ld, scale, causal, out)
    s = torch.from_numpy(x[:, :n]).double() * scale
    if causal >= 0:
        s = s.masked_fill(torch.ones(rows, n, dtype=torch.bool).triu(causal + 1), float("-inf"))
    want = torch.softmax(s, dim=-1).numpy()
    got = wasm.get(out, (rows, n), np.float32)
    _close(got, want, atol=1e-7)
    if causal >= 0:
        assert np.all(got[want == 0] == 0)


@pytest.mark.parametrize("weighted", [True, False])
def test_layer_norm_rows_matches_torch(wasm, weighted):
    rng = np.random.default_rng(12)
    for rows, d in ((3, 384), (2, 45), (1, 1)):
        x = (rng.standard_normal((rows, d)) * 3 + 1).astype(np.float32)
        w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
        out = wasm.alloc(rows * d * 4)
        wasm("layer_norm_rows", wasm.put(x), rows, d, wasm.put(w) if weighted else 0, wasm.put(b) if weighted else 0,
             1e-5, out)
        want = torch.nn.functional.layer_norm(torch.from_numpy(x).double(), (d,),
                                              torch.from_numpy(w).double() if weighted else None,
                                              torch.from_numpy(b).double() if weighted else None, 1e-5).numpy()
        _close(wasm.get(out, (rows, d), np.float32), want, rel=1e-5, atol=1e-5)


def test_f16_to_f32_is_bit_exact_for_every_pattern(wasm):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = wasm.alloc(65536 * 4)
    wasm("f16_to_f32", wasm.put(bits), 65536, out)
    want = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(wasm.get(out, (65536,), np.float32).view(np.uint32), want.view(np.uint32))


def test_f32_to_f16_rounds_as_numpy(wasm):
    """Round to nearest even at every f16 spacing: ties both ways, just above and below them,
    subnormals and their ties, the overflow edge (65519.99 -> 65504, 65520 -> inf), inf, -0, NaN."""
    rng = np.random.default_rng(13)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float64)
    with np.errstate(over="ignore"):
        nxt = np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    mids = ((h + nxt) / 2)[np.isfinite(nxt)]
    x = np.concatenate([
        rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 5, 5000), h, mids, np.nextafter(mids, 0),
        np.nextafter(mids, np.inf), [65519.99, 65520.0, -65520.0, 1e30, np.inf, -np.inf, -0.0, np.nan, 2.0 ** -25,
                                     2.0 ** -26, 1e-45]]).astype(np.float32)
    out = wasm.alloc(x.size * 2)
    wasm("f32_to_f16", wasm.put(x), x.size, out)
    got = wasm.get(out, (x.size,), np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rows_look_up_by_id(wasm, dtype):
    """Embedding rows (width 37: a tail) for repeated and edge ids; an id outside the table traps."""
    import wasmtime
    rng = np.random.default_rng(14)
    vocab, width = 11, 37
    table = rng.standard_normal((vocab, width)).astype(dtype)
    ids = np.array([0, 10, 3, 3, 7], np.int32)
    name = "rows_f32" if dtype == np.float32 else "rows_f16"
    at, out = wasm.put(table), wasm.alloc(ids.size * width * 4)
    wasm(name, at, vocab, width, wasm.put(ids), ids.size, out)
    assert np.array_equal(wasm.get(out, (ids.size, width), np.float32), table[ids].astype(np.float32))
    for bad in (vocab, -1):
        with pytest.raises(wasmtime.Trap):
            wasm(name, at, vocab, width, wasm.put(np.array([1, bad], np.int32)), 2, out)


def _view(wasm, rng, shape, strides, offset, near_one=False):
    """A view of a fresh random float32 buffer: (numpy view, its Layout, the buffer's address)."""
    size = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    base = (1 + rng.standard_normal(size) * 0.05 if near_one else rng.standard_normal(size) * 3).astype(np.float32)
    view = np.lib.stride_tricks.as_strided(base[offset:], shape, [4 * s for s in strides])
    return view, Layout(shape, strides, offset), wasm.put(base)


VIEWS = [  # (shape, strides, offset) in elements: contiguous, transposed, a sliced 4-d, a broadcast row, 0-d
    ((3, 5, 37), (185, 37, 1), 0),
    ((37, 6), (1, 37), 2),
    ((2, 3, 4, 19), (500, 150, 1, 4 * 2), 7),
    ((5, 33), (0, 1), 3),
    ((), (), 4),
]


@pytest.mark.parametrize("shape,strides,offset", VIEWS)
def test_unary_ops_on_strided_views(wasm, shape, strides, offset):
    rng = np.random.default_rng(len(shape) + offset)
    x, layout, at = _view(wasm, rng, shape, strides, offset)
    meta = wasm.put(np.array(kernel_meta(shape, [layout], MAX_DIMS), np.int32))
    t = torch.from_numpy(np.array(x)).double()
    a0, a1 = -0.75, 1.5
    want = {"neg": -t, "abs": t.abs(), "exp": t.exp(), "sqrt": t.sqrt(), "rsqrt": t.rsqrt(), "tanh": t.tanh(),
            "sigmoid": t.sigmoid(), "relu": t.relu(), "gelu": torch.nn.functional.gelu(t),
            "gelu_tanh": torch.nn.functional.gelu(t, approximate="tanh"), "silu": torch.nn.functional.silu(t),
            "square": t * t, "reciprocal": 1 / t, "floor": t.floor(), "ceil": t.ceil(), "round": t.round(),
            "sign": t.sign(), "clamp": t.clamp(a0, a1), "affine": t * a0 + a1}
    assert set(want) == set(UNARY_OPS)
    n = max(1, int(np.prod(shape)))
    for name, code in UNARY_OPS.items():
        out = wasm.alloc(n * 4)
        wasm("unary_f32", code, at, out, meta, a0, a1)
        got = wasm.get(out, shape, np.float32)
        ref = want[name].numpy()
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(got), nan), name
        _close(got[~nan], ref[~nan], rel=4e-6 if name not in ("gelu_tanh", "tanh") else 1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,sa,oa,sb,ob", [
    ((3, 5, 37), (185, 37, 1), 0, (185, 37, 1), 1),  # both contiguous
    ((37, 6), (1, 37), 2, (0, 1), 5),                  # a transposed view plus a broadcast row
    ((2, 3, 4, 19), (500, 150, 1, 8), 7, (0, 19, 57, 1), 0),
    ((1,), (1,), 0, (1,), 0),
])
def test_binary_ops_broadcast_and_strided(wasm, shape, sa, oa, sb, ob):
    rng = np.random.default_rng(oa + ob + len(shape))
    x, lx, ax = _view(wasm, rng, shape, sa, oa)
    y, ly, ay = _view(wasm, rng, shape, sb, ob)
    meta = wasm.put(np.array(kernel_meta(shape, [lx, ly], MAX_DIMS), np.int32))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    want = {"add": x64 + y64, "sub": x64 - y64, "mul": x64 * y64, "div": x64 / y64, "maximum": np.maximum(x, y),
            "minimum": np.minimum(x, y)}
    assert set(want) == set(BINARY_OPS)
    for name, code in BINARY_OPS.items():
        out = wasm.alloc(int(np.prod(shape)) * 4)
        wasm("binary_f32", code, ax, ay, out, meta)
        got = wasm.get(out, shape, np.float32)
        assert np.array_equal(got, want[name].astype(np.float32)), name  # one rounding of the exact result


def test_maximum_and_minimum_let_nan_win(wasm):
    x = np.array([np.nan, 1.0, -2.0, np.nan], np.float32)
    y = np.array([0.0, np.nan, 3.0, np.nan], np.float32)
    meta = wasm.put(np.array(kernel_meta((4,), [Layout((4,)), Layout((4,))], MAX_DIMS), np.int32))
    for name, fn in (("maximum", np.maximum), ("minimum", np.minimum)):
        out = wasm.alloc(16)
        wasm("binary_f32", BINARY_OPS[name], wasm.put(x), wasm.put(y), out, meta)
        got = wasm.get(out, (4,), np.float32)
        assert np.array_equal(got, fn(x, y), equal_nan=True)


@pytest.mark.parametrize("shape,strides,offset", VIEWS[:4] + [((4, 1), (1, 1), 0), ((2, 1000), (1000, 1), 0)])
def test_reductions_over_the_last_dim(wasm, shape, strides, offset):
    """sum, mean, max, min to float32 rounding of the float64 result; prod on values near 1 (a
    product of 1000 of them stays in range), within n roundings."""
    rng = np.random.default_rng(len(shape) * 3 + offset)
    rows, n = int(np.prod(shape[:-1])), shape[-1]
    for name, code in REDUCE_OPS.items():
        x, layout, at = _view(wasm, rng, shape, strides, offset, near_one=name == "prod")
        meta = wasm.put(np.array(kernel_meta(shape, [layout], MAX_DIMS, coalesce=False), np.int32))
        out = wasm.alloc(rows * 4)
        wasm("reduce_f32", code, at, meta, out)
        got = wasm.get(out, shape[:-1], np.float32)
        x64 = x.astype(np.float64)
        if name in ("max", "min"):
            assert np.array_equal(got, getattr(x, name)(-1)), name
        elif name == "prod":
            want = x64.prod(-1)
            assert np.all(np.abs(got - want) <= 2e-7 * n * np.abs(want)), name
        else:
            want, scale = x64.sum(-1), np.abs(x64).sum(-1)
            if name == "mean":
                want, scale = want / n, scale / n
            assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), name


def test_unknown_op_codes_trap(wasm):
    import wasmtime
    meta = wasm.put(np.array(kernel_meta((4,), [Layout((4,)), Layout((4,))], MAX_DIMS), np.int32))
    x, out = wasm.put(np.ones(4, np.float32)), wasm.alloc(16)
    for call in (("unary_f32", 3, x, out, meta, 0.0, 0.0), ("binary_f32", 4, x, x, out, meta),
                 ("reduce_f32", 9, x, meta, out)):
        with pytest.raises(wasmtime.Trap):
            wasm(*call)


def test_op_tables_use_the_gpu_kernels_numbering():
    """UNARY_OPS / BINARY_OPS / REDUCE_OPS are the GPU kernels' codes (a device maps its hooks onto
    both alike); "mean" is the one addition."""
    from tallow.backends.kernel.host import BINARY_CODES, REDUCE_CODES, UNARY_CODES
    assert all(UNARY_CODES[name] == code for name, code in UNARY_OPS.items())
    assert all(BINARY_CODES[name] == code for name, code in BINARY_OPS.items())
    assert {name: code for name, code in REDUCE_OPS.items() if name != "mean"} == REDUCE_CODES
