"""The host constants and choices both GPU planners share (tallow/backends/gpu_plan.py): one
definition each, which wgpu's planner and the CUDA/Metal kernel planner both use."""
import struct

import numpy as np
import pytest

from tallow import dtypes
from tallow.backends import gpu_plan


def test_both_planners_use_the_one_definition():
    from tallow.backends.kernel import backend as kernel_backend
    from tallow.backends.kernel import host
    from tallow_wgpu import backend as wgpu_backend
    from tallow_wgpu import tuning
    for module in (host, wgpu_backend, tuning):
        assert module.IN_KERNEL_QUANTS is gpu_plan.IN_KERNEL_QUANTS, module.__name__
    assert host.MAX_DIMS is wgpu_backend.MAX_DIMS is gpu_plan.MAX_DIMS
    assert host.f32_bits is wgpu_backend.f32_bits is gpu_plan.f32_bits
    assert kernel_backend.runs_matvec is wgpu_backend.runs_matvec is gpu_plan.runs_matvec


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
