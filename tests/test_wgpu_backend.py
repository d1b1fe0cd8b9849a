"""The wgpu backend beyond the contract suite (tests/conformance/ runs every primitive on the
"wgpu" device, with its refusals in conformance/test_primitives.py's NO_DTYPE / NARROW_INTS):
what only this backend has -- the direct convolution kernel for inputs too large to unfold,
command batching, the buffer pool, 2-D dispatch grids, binding limits, WGSL compile errors,
the missing-package error.

Runs on whatever WebGPU adapter the `wgpu` package finds (lavapipe on CI);
skipped, with the reason, where there is none.
"""

import numpy as np
import pytest

from tallow import dtypes as D
from tallow.backends.operand import Operand
from tallow.backends.specs import ConvSpec
from tallow.errors import DeviceError, UnsupportedError
from tallow.layout import Layout

from storage_io import down, up

try:
    from tallow_wgpu.backend import WgpuBackend, WgpuStorage
    _BACKEND = WgpuBackend()
    _REASON = None
except DeviceError as e:
    _BACKEND, _REASON = None, str(e)

pytestmark = pytest.mark.skipif(_BACKEND is None, reason=f"no wgpu adapter: {_REASON}")

RNG = np.random.default_rng(1234)
F32 = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def be():
    return _BACKEND


def rnd(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


# ---- beyond the contract -------------------------------------------------------------
def test_conv1d_conv2d_direct_kernel_vs_torch(be, monkeypatch):
    # an unfolded input too large for one binding takes the direct kernel (im2col + matmul: the conformance suite)
    monkeypatch.setitem(be.limits, "max_storage_binding", 1024)
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
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


def test_integer_input_to_a_float_op_is_refused(be):
    # The front end promotes integers to f32 for exp; called directly, this backend says it cannot.
    with pytest.raises(UnsupportedError):
        be.unary("exp", up(be, np.arange(4, dtype=np.int32), D.i32), Layout((4,)), D.i32)


# ---- driver behaviour -------------------------------------------------------------------------
def test_ops_are_batched_into_one_submit(be):
    x = rnd(64)
    st = up(be, x, D.f32)
    lay = Layout((64,))
    before = be.driver.submits
    y = st
    for _ in range(10):
        y = be.unary("affine", y, lay, D.f32, (1.0, 1.0))
    assert be.driver.submits == before  # nothing submitted until a readback
    np.testing.assert_allclose(down(be, y, (64,), D.f32), x + 10, **F32)
    assert be.driver.submits == before + 1


def test_storage_dying_in_a_garbage_cycle_leaves_its_buffer_usable(be):
    import gc
    for _ in range(3):
        holder = [up(be, rnd(16), D.f32)]
        holder.append(holder)  # a cycle: only the cyclic collector frees it
        del holder
        gc.collect()
        x = rnd(16)
        got = be.unary("neg", up(be, x, D.f32), Layout((16,)), D.f32)  # reuses the pooled buffer
        np.testing.assert_array_equal(down(be, got, (16,), D.f32), -x)


def test_two_dimensional_grid_when_workgroups_exceed_the_limit(be):
    small = WgpuBackend(be.driver)
    small.limits = dict(be.limits, max_workgroups_per_dim=5)  # 20 workgroups -> a 5 x 4 grid
    x = rnd(5000)
    got = small.unary("neg", up(small, x, D.f32), Layout((5000,)), D.f32)
    np.testing.assert_array_equal(down(small, got, (5000,), D.f32), -x)
    got = small.reduce("sum", up(small, x.reshape(10, 500), D.f32), Layout((10, 500)), D.f32, (1,))
    np.testing.assert_allclose(down(small, got, (10,), D.f32), x.reshape(10, 500).sum(1), rtol=1e-5)


def test_binding_limit_and_compile_errors_are_clear(be):
    st = up(be, rnd(4), D.f32)
    huge = WgpuStorage(st.buf, 0, be.limits["max_storage_binding"] + 4)  # claims more than any binding may
    with pytest.raises(UnsupportedError, match="maxStorageBufferBindingSize"):
        be.unary("exp", huge, Layout((4,)), D.f32)
    with pytest.raises(DeviceError, match="my_kernel"):
        be.driver.pipeline("@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }", "my_kernel")


def test_missing_wgpu_package_is_a_device_error(monkeypatch):
    import sys
    from tallow_wgpu import driver_native
    monkeypatch.setitem(sys.modules, "wgpu", None)
    with pytest.raises(DeviceError, match="pip install wgpu"):
        driver_native.NativeDriver()


def test_f16_without_shader_f16_round_trips_like_numpy(be):
    """On an adapter without shader-f16 (Chrome's SwiftShader) f16 lives as f32 rounded to f16;
    its bytes, overflow to inf, NaN, subnormals and signed zeros must still be numpy's."""
    plain = WgpuBackend(be.driver)
    plain.has_f16 = False
    x = np.array([1 / 3, 0.1, -2.7, 65519.0, 65520.0, 1e5, -1e5, 1e-8, 6e-8, -3e-5, 2.5, -0.0, 1.0009765625,
                  1.00048828125, 3.0e38, 1.00390625, np.inf, -np.inf, np.nan, -7.0e-39], np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    st = plain.cast(plain.from_bytes(x.tobytes(), D.f32), Layout(x.shape), D.f32, D.f16)
    got = plain.to_bytes(st, Layout(x.shape), D.f16)
    assert np.frombuffer(got, np.uint16)[~np.isnan(want)].tolist() == want.view(np.uint16)[~np.isnan(want)].tolist()
    assert np.isnan(np.frombuffer(got, np.float16)[np.isnan(want)]).all()
    assert plain.to_bytes(plain.from_bytes(want.tobytes(), D.f16), Layout(x.shape), D.f16) == want.tobytes()


def test_kernel_includes_expand_and_a_self_include_is_refused(tmp_path, monkeypatch):
    # The variants share text through `// #include "x.wgsl"` (wgsl.kernel_text): every kernel
    # the drivers get (native and browser alike) has them expanded, each pair the same text.
    from importlib import resources
    from types import SimpleNamespace

    from tallow_wgpu import wgsl
    names = [p.name[:-5] for p in resources.files("tallow_wgpu").joinpath("kernels").iterdir()
             if p.name.endswith(".wgsl")]
    for name in names:
        assert "#include" not in wgsl.kernel_text(name), name
    for a, b, shared in (("matvec_rows", "matvec_rows_glu", "matvec_rows_cols"), ("qmatvec", "qmatvec_glu", "qmatvec_cols"),
                         ("matmul_tiled", "qmatmul_tiled", "tile_multiply"), ("attend", "cache_attend", "attend_rescale")):
        part = wgsl.kernel_text(shared)
        assert part in wgsl.kernel_text(a) and part in wgsl.kernel_text(b), (a, b)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "loop_a.wgsl").write_text('// #include "loop_b.wgsl"\n')
    (tmp_path / "kernels" / "loop_b.wgsl").write_text('fn f() {}\n    // #include "loop_a.wgsl"\n')
    monkeypatch.setattr(wgsl, "resources", SimpleNamespace(files=lambda package: tmp_path))
    monkeypatch.setattr(wgsl, "_cache", {})
    with pytest.raises(ValueError, match="loop_a.wgsl includes itself"):
        wgsl.kernel_text("loop_a")
