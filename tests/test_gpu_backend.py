"""The one GPU backend core (tallow/backends/gpu_backend.py) under WgpuBackend and KernelBackend:
its buffer pool (buffer_pool.py) and the plans both planners take from it. The promise a pool
rests on (a new storage is written before it is read) is tests/conformance/test_fresh_buffers.py."""
import gc

import pytest

from tallow import dtypes
from tallow.backends.buffer_pool import MIB, BufferPool, size_class
from tallow.backends.gpu_backend import OPTIONAL_FUSED, GpuBackend
from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.kernel.null_driver import NullKernelDriver
from tallow.backends.operand import Operand, QuantWeight
from tallow.backends.specs import LinearSpec, NormSpec
from tallow.errors import UnsupportedError
from tallow.layout import Layout


class CountingDriver:
    def __init__(self):
        self.allocs = []

    def alloc(self, dtype, numel):
        self.allocs.append((dtype.name, numel))
        return object()


def test_size_classes_round_up_to_powers_of_two_then_whole_mebibytes():
    assert [size_class(n) for n in (0, 1, 8, 9, 100, MIB - 1)] == [8, 8, 8, 16, 128, MIB]
    assert size_class(MIB + 1) == 2 * MIB and size_class(3 * MIB) == 3 * MIB


def test_the_pool_reuses_a_buffer_of_the_same_class_and_dtype_only():
    driver = CountingDriver()
    pool = BufferPool(driver)
    buf, cap = pool.acquire(100, dtypes.f32)
    assert cap == 128 and driver.allocs == [("f32", 32)]  # elements of the class, as alloc counts them
    pool.release(buf, cap, dtypes.f32)
    assert pool.acquire(120, dtypes.f32) == (buf, 128) and pool.hits == 1
    pool.release(buf, cap, dtypes.f32)
    other, _ = pool.acquire(120, dtypes.i32)  # another dtype: a buffer of its own
    assert other is not buf and driver.allocs[-1] == ("i32", 32)
    pool.acquire(34, dtypes.get_dtype("q8_0"))
    assert driver.allocs[-1] == ("q8_0", 64)  # block dtypes count bytes


def test_the_pool_keeps_at_most_max_cached_bytes_idle():
    pool = BufferPool(CountingDriver(), max_cached=256)
    bufs = [pool.acquire(128) for _ in range(3)]
    for buf, cap in bufs:
        pool.release(buf, cap)
    assert pool.cached == 256  # the third was dropped
    pool.clear()
    assert pool.cached == 0 and pool.acquire(128)[0] not in [b for b, _ in bufs]


def test_a_pool_of_no_bytes_allocates_exactly_and_keeps_nothing():
    """The CUDA backend's: CuPy's memory pool already reuses device memory."""
    from tallow_cuda.backend import CudaBackend
    assert CudaBackend.pool_bytes == 0
    driver = CountingDriver()
    pool = BufferPool(driver, max_cached=0)
    buf, cap = pool.acquire(100, dtypes.f32)
    assert cap == 100 and driver.allocs == [("f32", 25)]
    pool.release(buf, cap, dtypes.f32)
    assert pool.cached == 0 and pool.acquire(100, dtypes.f32)[0] is not buf


@pytest.fixture(params=["wgpu", "kernel"])
def null_backend(request):
    """A GPU backend over its do-nothing driver: the pool's effect is visible in the driver's allocs."""
    if request.param == "wgpu":
        from tallow_wgpu.backend import WgpuBackend
        from tallow_wgpu.driver_null import NullDriver
        return WgpuBackend(NullDriver())
    return KernelBackend(NullKernelDriver())


def test_a_dead_storage_gives_its_buffer_back_on_every_gpu_backend(null_backend):
    be = null_backend
    assert isinstance(be, GpuBackend)
    st = be.full(1000, 1.0, dtypes.f32)
    misses = be.pool.misses
    del st
    gc.collect()
    st = be.full(900, 2.0, dtypes.f32)  # the same size class
    assert be.pool.misses == misses and be.pool.hits >= 1
    assert be.to_bytes(st, Layout((900,)), dtypes.f32) is not None


def test_both_planners_take_the_shared_plans():
    from tallow_wgpu.backend import WgpuBackend
    for op in ("reduce", "add_rms_norm", "add_layer_norm", "kv_write", "rope_kv_write", "conv1d", "custom",
               "_add_norm", "_submit", "_cache_write_position", "_reads_whole_cache", "_slot_words"):
        assert getattr(WgpuBackend, op) is getattr(KernelBackend, op) is getattr(GpuBackend, op), op


def test_the_optional_fused_ops_are_planned_once_and_say_where_they_compose():
    """qmatmul_bias, add_norm_linear and cache_attention: GpuBackend's plan on both planners (no
    override outside it); one launch where fused_kernels lists the op, else composed, as
    plan_features (`tallow devices`) reports."""
    from tallow_wgpu.backend import WgpuBackend
    for op in OPTIONAL_FUSED:
        assert getattr(WgpuBackend, op) is getattr(KernelBackend, op) is getattr(GpuBackend, op), op
    assert set(WgpuBackend.fused_kernels) == set(OPTIONAL_FUSED)
    be = KernelBackend(NullKernelDriver())
    assert be.plan_features() == {"fused_ops": "qmatmul_bias", "composed_ops": "add_norm_linear,cache_attention"}
    f32, q8_0 = dtypes.f32, dtypes.get_dtype("q8_0")
    x, b, w = be.full(64, 1.0, f32), be.full(12, 0.5, f32), be.from_bytes(bytes(34 * 2 * 12), q8_0)
    before = be.driver.launches
    qw = QuantWeight(w, q8_0, 12, 64)
    be.qmatmul_bias(Operand(x, Layout((1, 64))), qw, Operand(b, Layout((12,))), f32)
    assert be.driver.launches - before == 1  # the biased matvec: one kernel, no add after it
    before = be.driver.launches
    row = Operand(x, Layout((1, 64)))
    be.add_norm_linear(row, row, NormSpec(Operand(b, Layout((64,))), None, 1e-5), LinearSpec(qw, Operand(b, Layout((12,)))),
                       f32)
    assert be.driver.launches - before == 2  # composed: add + RMS norm, then the biased matvec


def test_cache_offsets_beyond_int32_are_refused():
    with pytest.raises(UnsupportedError, match="int32"):
        GpuBackend._slot_words(Layout((1, 2, 4, 8), (1 << 32, 32, 8, 1)), 0, 2)
    assert GpuBackend._slot_words(Layout((1, 2, 4, 8), (64, 32, 8, 1), 40), 5, 2) == [0, 64, 32, 8, 1]


def test_each_gpu_backend_fills_the_whole_kernel_table():
    """Every hook the core's plans call (a GpuBackend method that only raises NotImplementedError)
    is implemented by both backends, so a missing one fails here, not on a device."""
    import inspect

    from tallow_wgpu.backend import WgpuBackend
    hooks = [name for name, fn in vars(GpuBackend).items() if inspect.isfunction(fn)
             and inspect.getsource(fn).rstrip().endswith("raise NotImplementedError")]
    assert len(hooks) >= 19 and "_attention_kernel" in hooks and "_new" in hooks
    for backend in (WgpuBackend, KernelBackend):
        missing = [h for h in hooks if getattr(backend, h) is getattr(GpuBackend, h)]
        if backend is KernelBackend:  # its im2col columns always fit (_im2col_fits): no direct convolution
            assert KernelBackend._im2col_fits is GpuBackend._im2col_fits
            missing.remove("_direct_conv_kernel")
        # An optional fused op's hooks may be missing only where the plan composes that op.
        for op, op_hooks in OPTIONAL_FUSED.items():
            if op not in backend.fused_kernels:
                missing = [h for h in missing if h not in op_hooks]
        assert missing == [], f"{backend.__name__} lacks {missing}"
