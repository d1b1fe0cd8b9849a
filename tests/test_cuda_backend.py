"""The CUDA backend, beyond the conformance suite.

The op suite (tests/conformance/) runs on the "cuda" device of tests/conftest.py: on a CUDA
GPU with cupy, the real one; and always as "cuda-emulator", the CUDA C kernels themselves
compiled by g++ for the CPU emulator (tallow_cuda.cpu_driver: blocks as fibers, __syncthreads
and shuffles synchronise; numpy stands in for cuBLAS), driven by the same host logic. The
real device is also probed, and skips with the DeviceError's reason where absent. The host-side logic
(argument packing of shapes and strides, launch grids, dtype mapping, value bits) is tested
on its own against tallow.Layout, numpy, ctypes and torch.
"""
import ctypes
import random
import re

import numpy as np
import pytest

import tallow
from tallow.layout import Layout
from tallow.backends.kernel import host
from tallow_cuda.driver import SCALAR_TYPES, kernel_source, storage_numpy_dtype

from conftest import emulated

RNG = random.Random(0)


# ---- argument packing ---------------------------------------------------------------------
def _random_layout(rank):
    """A random view: a permuted, narrowed, possibly broadcast layout over a bigger buffer."""
    base = [RNG.randint(1, 5) for _ in range(rank)]
    layout = Layout(base, None, RNG.randint(0, 7))
    perm = list(range(rank))
    RNG.shuffle(perm)
    layout = layout.permute(perm)
    for d in range(rank):
        if layout.shape[d] > 1 and RNG.random() < 0.3:
            start = RNG.randint(0, layout.shape[d] - 1)
            layout = layout.narrow(d, start, RNG.randint(1, layout.shape[d] - start))
    if RNG.random() < 0.4:  # broadcast a size-1 dim
        shape = list(layout.shape)
        shape.insert(0, 3)
        layout = layout.broadcast_to(shape)
    return layout


@pytest.mark.parametrize("rank", [0, 1, 2, 3, 4, 5, 6])
def test_pack_meta_locates_every_element(rank):
    """What the kernels compute from meta (host.meta_offset mirrors strided_offset) equals
    Layout.offsets(), for two operands of the same shape with unrelated strides."""
    for _ in range(40):
        a = _random_layout(rank)
        b = Layout(a.shape, [RNG.choice([0, 1, 2, 7]) for _ in a.shape], RNG.randint(0, 5))
        meta = host.pack_meta(a.shape, [a, b])
        assert len(meta) == 1 + host.MAX_DIMS + 2 * (host.MAX_DIMS + 1)
        want_a, want_b = a.offsets(), b.offsets()
        for i in range(a.numel()):
            assert host.meta_offset(meta, 0, i) == want_a[i]
            assert host.meta_offset(meta, 1, i) == want_b[i]


def test_pack_meta_merges_contiguous_dims():
    # a 10-d contiguous tensor fits in one dim, so the 8-dim limit only bites for strided ones
    ten = (2,) * 10
    assert host.pack_meta(ten, [Layout(ten)])[0] == 1
    strided = Layout(ten, [2 ** (2 * i + 1) for i in range(10)])
    with pytest.raises(tallow.UnsupportedError, match="dims"):
        host.pack_meta(ten, [strided])


def test_pack_meta_refuses_offsets_beyond_int32():
    with pytest.raises(tallow.UnsupportedError, match="2\\*\\*31"):
        host.pack_meta((2, 2), [Layout((2, 2), (1 << 31, 1))])


def test_rows_of_a_layout_with_reduced_dims_last():
    _, pl = Layout((2, 3, 4, 5)).moved_last((0, 2))
    assert host.rows_of(pl.shape, 2) == (15, 8)
    assert host.rows_of(pl.shape, 0) == (120, 1)


# ---- launch grids -------------------------------------------------------------------------------
@pytest.mark.parametrize("n,expected", [(0, 0), (1, 1), (256, 1), (257, 2), (10 ** 6, 3907),
                                        (10 ** 10, host.MAX_BLOCKS)])
def test_grid_1d(n, expected):
    blocks = host.grid_1d(n)
    assert blocks == expected
    if 0 < n <= host.MAX_BLOCKS * host.BLOCK:  # an uncapped grid has a thread for every element, and no spare block
        assert blocks * host.BLOCK >= n > (blocks - 1) * host.BLOCK


def test_grid_qmatvec_and_rows():
    grid, block = host.grid_qmatvec(576, 3)
    assert block == (128, 1, 1) and grid == (144, 3, 1)  # 4 warps (columns) per block
    grid, block = host.grid_qmatvec(577, 1)
    assert grid == (145, 1, 1)
    assert host.grid_rows(7) == ((7, 1, 1), (host.BLOCK, 1, 1))


# ---- dtypes and values ---------------------------------------------------------------------------
_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "unsigned short": ctypes.c_uint16,
           "long long": ctypes.c_longlong, "int": ctypes.c_int, "signed char": ctypes.c_byte,
           "unsigned int": ctypes.c_uint, "unsigned char": ctypes.c_ubyte}


@pytest.mark.parametrize("dtype", host.ALL_DTYPES, ids=lambda d: d.name)
def test_dtype_mapping(dtype):
    """The C storage type and the cupy (numpy) storage dtype both have the tallow dtype's width,
    and the kernels of its families are named after it."""
    assert ctypes.sizeof(_CTYPES[host.C_STORAGE_TYPES[dtype.name]]) == dtype.itemsize
    assert np.dtype(storage_numpy_dtype(dtype)).itemsize == dtype.itemsize
    assert host.kernel_name("unary", dtype) == f"unary_{dtype.name}"
    assert host.width_kernel("copy", dtype) == f"copy_w{dtype.itemsize}"
    work = host.SCATTER_WORK_DTYPES[dtype.name]
    assert work.itemsize >= min(dtype.itemsize, 4) and (work.is_float == dtype.is_float)


def test_quantised_storage_is_bytes():
    assert storage_numpy_dtype(tallow.get_dtype("q4_k")) == "uint8"


def test_scalar_bits_match_numpy_and_torch():
    torch = pytest.importorskip("torch")
    values = [0.0, -0.0, 1.0, -2.5, 1e-3, 3.14159, 65504.0, 70000.0, 1e-8, float("inf"), -float("inf"), 1e39]
    with np.errstate(over="ignore"):  # the references overflow to inf, as the kernels do
        for v in values:
            assert host.scalar_bits(v, tallow.f16) == int(np.array(v, np.float32).astype(np.float16).view(np.uint16))
            assert host.scalar_bits(v, tallow.f32) == int(np.array(v, np.float32).view(np.uint32))
            assert host.scalar_bits(v, tallow.f64) == int(np.array(v, np.float64).view(np.uint64))
            ref = torch.tensor(np.float32(v)).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
            assert host.scalar_bits(v, tallow.bf16) == ref, v
    assert host.scalar_bits(float("nan"), tallow.bf16) == 0x7FC0
    assert host.scalar_bits(-1, tallow.i8) == 0xFF and host.scalar_bits(-1, tallow.i64) == (1 << 64) - 1
    assert host.scalar_bits(300, tallow.u8) == 300 & 0xFF and host.scalar_bits(2.0, tallow.bool_) == 1


@pytest.mark.parametrize("dtype", host.ALL_DTYPES, ids=lambda d: d.name)
def test_unpack_values_matches_numpy(dtype):
    rng = np.random.default_rng(1)
    if dtype is tallow.bool_:
        arr = rng.integers(0, 2, 17).astype(bool)
    elif dtype.is_float:
        arr = (rng.standard_normal(17) * 100).astype("float32" if dtype is tallow.bf16 else dtype.np_name)
    else:
        info = np.iinfo(dtype.np_name)
        arr = rng.integers(max(info.min, -1000), min(info.max, 1000), 17).astype(dtype.np_name)
    if dtype is tallow.bf16:
        raw = (arr.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        ref = ((np.frombuffer(raw, np.uint16).astype(np.uint32)) << 16).view(np.float32).tolist()
    else:
        raw, ref = arr.tobytes(), arr.tolist()
    assert host.unpack_values(raw, dtype) == ref


def test_pack_values_staging():
    assert host.staging_dtype(tallow.f16) is tallow.f64 and host.staging_dtype(tallow.u8) is tallow.i64
    assert host.pack_values([1.5, -2], tallow.f64) == np.array([1.5, -2], np.float64).tobytes()
    assert host.pack_values([1e40, 2.0], tallow.f32) == np.array([np.inf, 2.0], np.float32).tobytes()
    assert host.pack_values([True, 0, 3], tallow.bool_) == b"\x01\x00\x01"
    assert host.pack_values([-1, 2 ** 40], tallow.i64) == np.array([-1, 2 ** 40], np.int64).tobytes()


def test_op_codes_match_the_kernel_enums():
    """The host's op codes are the enum order in gpu_kernels/common.h (a reordering would silently swap ops)."""
    src = kernel_source("elementwise")
    for prefix, table in (("U_", host.UNARY_CODES), ("B_", host.BINARY_CODES), ("C_", host.COMPARE_CODES)):
        body = re.search(r"enum \{ (" + prefix + r"[^}]*)\}", src).group(1)
        names = [n.strip()[len(prefix):].lower() for n in body.split(",") if n.strip()]
        assert names == list(table), prefix


# ---- the device ----------------------------------------------------------
def _real_cuda_reason():
    """None when a real CUDA backend constructs here, else the DeviceError's reason."""
    from tallow_cuda.backend import CudaBackend
    try:
        CudaBackend()
        return None
    except tallow.DeviceError as e:
        return str(e)


def test_real_cuda_device():
    reason = _real_cuda_reason()
    if reason:
        assert "cupy" in reason or "CUDA" in reason  # the reason names what is missing
        pytest.skip(f"no CUDA device here: {reason}")
    from tallow_cuda.backend import CudaBackend
    feats = CudaBackend().features()
    assert feats["backend"] == "cuda" and feats["compute_capability"]


def test_scalar_arguments_have_the_kernels_c_types():
    """I32 -> int, I64 -> long long, U32 -> unsigned int (a custom op's numel), U64 -> unsigned long long,
    F64 -> double, as the .cu kernels declare."""
    from tallow_cuda.cpu_driver import pack_cuda_arg
    assert {k.__name__: v for k, v in SCALAR_TYPES.items()} == {"I32": "int32", "I64": "int64", "U32": "uint32",
                                                                "U64": "uint64", "F64": "float64"}
    assert pack_cuda_arg(host.U32(0xFFFFFFFF)) == np.uint32(0xFFFFFFFF).tobytes()
    assert pack_cuda_arg(host.F64(0.1)) == np.float64(0.1).tobytes()
    assert pack_cuda_arg(host.I64(-5)) == np.int64(-5).tobytes()
    assert pack_cuda_arg(host.Meta([3, -1])) == np.array([3, -1], np.int32).tobytes()


def test_the_emulated_device_launches_the_cuda_kernels():
    """The "cuda-emulator" device of the conformance suite really runs the CUDA C kernels:
    bound through tallow.device.use_backend, an op launches them, and the name is restored after."""
    backend = emulated("cuda-emulator")
    dev = tallow.device.use_backend("cuda", backend)
    try:
        assert tallow.Device("cuda") is dev and dev.backend is backend and tallow.default_device() != "cuda"
        launches = backend.driver.launches
        got = tallow.tensor([[1.0, -2.0], [3.0, 0.5]], device="cuda").exp().sum(1)
        assert backend.driver.launches >= launches + 2
        np.testing.assert_allclose(got.numpy(), np.exp([[1.0, -2.0], [3.0, 0.5]]).sum(1), rtol=1e-6)
    finally:
        tallow.device.restore_backend("cuda")
    try:
        assert tallow.Device("cuda").backend is not backend
    except tallow.DeviceError:  # no real CUDA here: the name means that again
        pass


# ---- capture and replay on CuPy (no GPU here: CuPy's stream capture faked, the driver's own logic run) --------
class _FakeStream:
    """cupy.cuda.Stream's capture calls: launches while capturing are recorded, not run."""

    def __init__(self, refuse=False):
        self.refuse, self.capturing, self.captured = refuse, False, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        if self.refuse:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported")
        self.capturing, self.captured = True, []

    def end_capture(self):
        self.capturing = False
        return _FakeGraph(self.captured)


class _FakeGraph:
    def __init__(self, launches):
        self.launches, self.launched = launches, 0

    def launch(self, stream=None):
        self.launched += 1
        for kernel, args in self.launches:
            kernel.run(args)


class _FakeKernel:
    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def __call__(self, grid, block, args):
        if self.stream.capturing:
            self.stream.captured.append((self, args))
        else:
            self.run(args)

    def run(self, args):
        self.log.append(args)


def _fake_cupy_driver(refuse=False):
    from tallow_cuda.driver import CupyDriver
    driver = CupyDriver.__new__(CupyDriver)  # no cupy, no GPU: only record/replay are exercised
    driver._graph_stream, driver.graph_error, log = _FakeStream(refuse), None, []
    kernel = _FakeKernel(driver._graph_stream, log)
    driver.function = lambda module, name: kernel
    driver.convert_arg = lambda a: ("converted", a)
    return driver, log


def test_cupy_replays_a_captured_cuda_graph():
    driver, log = _fake_cupy_driver()
    graph, _ = driver.record([("launch", "m", "k", (1, 1, 1), (32, 1, 1), [1, 2])])
    assert log == [] and graph is not None  # captured, not run
    driver.replay((graph, _))
    driver.replay((graph, _))
    assert graph.launched == 2 and log == [(("converted", 1), ("converted", 2))] * 2


def test_cupy_replays_host_calls_and_refused_captures_launch_by_launch():
    driver, log = _fake_cupy_driver()
    handle = driver.record([("launch", "m", "k", (1, 1, 1), (32, 1, 1), [1]), ("call", lambda: log.append("matmul"), ())])
    assert handle[0] is None  # a cuBLAS call in the step: no graph
    driver.replay(handle)
    assert log == [(("converted", 1),), "matmul"]
    refusing, log = _fake_cupy_driver(refuse=True)
    handle = refusing.record([("launch", "m", "k", (1, 1, 1), (32, 1, 1), [3])])
    assert handle[0] is None and "cudaErrorStreamCaptureUnsupported" in refusing.graph_error
    refusing.replay(handle)
    assert log == [(("converted", 3),)]
