"""The host constants and choices both GPU planners share (tallow/backends/gpu_plan.py): one
definition each, which wgpu's planner and the CUDA/Metal kernel planner both use."""
import itertools
import struct

import numpy as np
import pytest

from tallow import dtypes
from tallow import errors as tallow_errors
from tallow.backends import gpu_plan


def test_both_planners_use_the_one_definition():
    from tallow.backends.kernel import backend as kernel_backend
    from tallow.backends.kernel import host
    from tallow_wgpu import backend as wgpu_backend
    from tallow_wgpu import common as wgpu_common
    from tallow_wgpu import matmul as wgpu_matmul
    from tallow_wgpu import tuning
    for module in (host, wgpu_backend, tuning):
        assert module.IN_KERNEL_QUANTS is gpu_plan.IN_KERNEL_QUANTS, module.__name__
    assert host.MAX_DIMS is wgpu_common.MAX_DIMS is gpu_plan.MAX_DIMS
    assert host.f32_bits is wgpu_matmul.f32_bits is gpu_plan.f32_bits
    assert kernel_backend.runs_matvec is wgpu_matmul.runs_matvec is gpu_plan.runs_matvec


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k"])
def test_in_kernel_formats_run_the_matvec_up_to_the_backends_threshold(name):
    wdtype = dtypes.get_dtype(name)
    assert gpu_plan.runs_matvec(8, 8, wdtype) and not gpu_plan.runs_matvec(9, 8, wdtype)
    assert gpu_plan.runs_matvec(64, 64, wdtype) and not gpu_plan.runs_matvec(65, 64, wdtype)


def test_other_formats_never_run_the_quantised_matvec():
    q5_0 = dtypes.get_dtype("q5_0")
    assert not gpu_plan.in_kernel_quant(q5_0)
    assert not gpu_plan.runs_matvec(1, 64, q5_0)
    assert gpu_plan.runs_matvec(1, 64)  # a float weight: the threshold alone decides


def test_f32_bits_match_numpy():
    values = [0.0, -0.0, 1.0, -2.5, 3.4028234663852886e38, 1e-45, float("inf"), 7]
    expected = np.array(values, dtype=np.float32).view(np.uint32).tolist()
    assert [gpu_plan.f32_bits(v) for v in values] == expected
    with pytest.raises(OverflowError):
        gpu_plan.f32_bits(1e39)
    assert struct.pack("<I", gpu_plan.f32_bits(0.1)) == struct.pack("<f", 0.1)


def test_both_planners_plan_reductions_the_one_way():
    from tallow.backends.gpu_backend import GpuBackend
    from tallow.backends.kernel.backend import KernelBackend
    from tallow_wgpu.backend import WgpuBackend
    assert KernelBackend.reduce is WgpuBackend.reduce is GpuBackend.reduce  # plan_reduce, then each one's kernel


@pytest.mark.parametrize("shape, dims", [((3, 4), (1,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (2, 0)), ((5,), ()),
                                         ((3, 0), (1,)), ((0, 3), (1,)), ((2, 3), (0, 1))])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_reduce_plans_agree_with_numpy(op, shape, dims):
    from tallow.backends.reduce_plan import plan_reduce
    from tallow.layout import Layout
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    try:
        expected = getattr(np, {"max": "amax", "min": "amin"}.get(op, op))(x, axis=dims)
    except ValueError:  # numpy: "zero-size array to reduction operation ... which has no identity"
        with pytest.raises(tallow_errors.ShapeError, match="empty dim"):
            plan_reduce("wgpu", op, Layout(shape), dtypes.f32, dims)
        return
    plan = plan_reduce("wgpu", op, Layout(shape), dtypes.f32, dims)
    assert plan.rows == expected.size and plan.length == int(np.prod([shape[d] for d in dims]))
    assert plan.out_dtype is dtypes.f32
    assert plan.layout.shape == tuple(s for d, s in enumerate(shape) if d not in dims) + tuple(
        shape[d] for d in sorted(dims))


def test_reduce_plans_refuse_what_no_gpu_kernel_does():
    from tallow.backends.reduce_plan import plan_reduce
    from tallow.layout import Layout
    assert plan_reduce("cuda", "sum", Layout((2, 3)), dtypes.i32, (1,)).out_dtype is dtypes.i64
    assert plan_reduce("cuda", "argmax", Layout((2, 3)), dtypes.f16, (1,)).out_dtype is dtypes.i64
    with pytest.raises(tallow_errors.ShapeError, match="exactly one dim"):
        plan_reduce("metal", "argmin", Layout((2, 3)), dtypes.f32, (0, 1))
    with pytest.raises(tallow_errors.UnsupportedError, match="the metal backend has no reduce mean"):
        plan_reduce("metal", "mean", Layout((2, 3)), dtypes.f32, (1,))


@pytest.mark.parametrize("device", ["cpu", "wgpu", "cuda-emulator", "metal-emulator"])
def test_max_over_an_empty_dim_is_refused_even_into_an_empty_result(device, request):
    # numpy and torch refuse it; wgpu used to return an empty tensor here.
    import tallow
    dev = request.getfixturevalue("wgpu") if device == "wgpu" else _bound(device, request)
    with pytest.raises(tallow_errors.ShapeError, match="empty dim"):
        tallow.zeros(0, 0, device=dev).max(dim=1)
    assert tallow.zeros(0, 0, device=dev).sum(dim=1).shape == (0,)


def _bound(device, request):
    if device == "cpu":
        return "cpu"
    from conftest import DEVICES, emulated
    from tallow.device import restore_backend, use_backend
    name = DEVICES[device][0]
    request.addfinalizer(lambda: restore_backend(name))
    return use_backend(name, emulated(device))


def test_conv_output_size_matches_torch():
    torch = pytest.importorskip("torch")
    for size, k, s, p, d in itertools.product([5, 11, 16], [1, 3], [1, 2], [0, 2], [1, 2]):
        if size + 2 * p < d * (k - 1) + 1:
            continue
        ref = torch.nn.functional.conv1d(torch.zeros(1, 1, size), torch.zeros(1, 1, k), None, s, p, d).shape[-1]
        assert gpu_plan.conv_output_size(size, k, s, p, d) == ref
