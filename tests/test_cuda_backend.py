"""The CUDA backend.

The op suite of test_ops.py is imported below and runs on Device("cuda"): on a CUDA GPU
with cupy, the real one; elsewhere the CUDA C kernels themselves, compiled by g++ for the
CPU emulator (tallow_cuda.cpu_driver: blocks as fibers, __syncthreads and shuffles
synchronise; numpy stands in for cuBLAS), driven by the same host logic. The real device
is also probed, and skips with the DeviceError's reason where absent. The host-side logic
(argument packing of shapes and strides, launch grids, dtype mapping, value bits) is tested
on its own against tallow.Layout, numpy, ctypes and torch.
"""
import ctypes
import itertools
import random
import re

import numpy as np
import pytest

import tallow
from tallow.layout import Layout
from tallow import device as device_module
from tallow_cuda import host
from tallow_cuda.driver import SCALAR_TYPES, kernel_source, storage_numpy_dtype

import test_ops
from test_ops import *  # noqa: F401,F403  (the op suite, run on this module's `device` below)

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
@pytest.mark.parametrize("n,expected", [(0, 0), (1, 1), (256, 1), (257, 2), (10 ** 6, 3907), (10 ** 10, host.MAX_BLOCKS)])
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


def test_conv_output_size_matches_torch():
    torch = pytest.importorskip("torch")
    for size, k, s, p, d in itertools.product([5, 11, 16], [1, 3], [1, 2], [0, 2], [1, 2]):
        if size + 2 * p < d * (k - 1) + 1:
            continue
        ref = torch.nn.functional.conv1d(torch.zeros(1, 1, size), torch.zeros(1, 1, k), None, s, p, d).shape[-1]
        assert host.conv_output_size(size, k, s, p, d) == ref


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
    """The host's op codes are the enum order in common.cuh (a reordering would silently swap ops)."""
    src = kernel_source("elementwise")
    for prefix, table in (("U_", host.UNARY_CODES), ("B_", host.BINARY_CODES), ("C_", host.COMPARE_CODES)):
        body = re.search(r"enum \{ (" + prefix + r"[^}]*)\}", src).group(1)
        names = [n.strip()[len(prefix):].lower() for n in body.split(",") if n.strip()]
        assert names == list(table), prefix


def quantised_blocks(qtype, n, k, seed=0):
    """GGUF blocks of an (n, k) weight: quantised by tallow.quant, or for Q6_K (no quantiser
    there) random blocks with a sane f16 scale; references dequantise them with tallow.quant,
    which is checked bit-exact against the gguf package in test_quant.py."""
    from tallow.quant import quantize_numpy
    rng = np.random.default_rng(seed)
    if qtype != "q6_k":
        return quantize_numpy(rng.standard_normal((n, k)).astype(np.float32), qtype)
    blocks = rng.integers(0, 256, (n * k // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    return blocks


# ---- the device these tests run on ----------------------------------------------------------
def _real_cuda_reason():
    """None when a real CUDA backend constructs here, else the DeviceError's reason."""
    from tallow_cuda.backend import CudaBackend
    try:
        CudaBackend()
        return None
    except tallow.DeviceError as e:
        return str(e)


@pytest.fixture(scope="module")
def cuda_device():
    """The real CUDA device if there is one, else the CUDA kernels on the CPU emulator."""
    if _real_cuda_reason() is None:
        yield tallow.Device("cuda")
        return
    import shutil
    if shutil.which("g++") is None:
        pytest.skip(f"no CUDA device ({_real_cuda_reason()}) and no g++ for the CPU emulator")
    saved, saved_default = device_module._BACKENDS["cuda"], device_module._default
    device_module._default = tallow.Device("cpu")  # default_device() must not pick the emulator meanwhile
    device_module._instances.pop("cuda", None)
    device_module._BACKENDS["cuda"] = ("tallow_cuda.cpu_driver", "CudaCpuEmulatorBackend", "")
    try:
        yield tallow.Device("cuda")
    finally:
        device_module._BACKENDS["cuda"] = saved
        device_module._default = saved_default
        device_module._instances.pop("cuda", None)


@pytest.fixture
def device(cuda_device):
    """Overrides conftest's device fixture for the imported op suite and the checks below."""
    return cuda_device


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


@pytest.mark.parametrize("qtype", host.IN_KERNEL_QUANTS)
@pytest.mark.parametrize("m", [1, 3, 12])  # the in-kernel matvec path and the dequantise + cuBLAS path
def test_quantised_matmul_matches_numpy(device, qtype, m):
    from tallow.quant import qmatmul_numpy
    rng = np.random.default_rng(0)
    n, k = 64, 512
    blocks = quantised_blocks(qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    wt = tallow.from_buffer(bytes(blocks), qtype, (n, k), device=device)
    got = (tallow.from_numpy(x, device=device) @ wt.T).numpy()
    np.testing.assert_allclose(got, qmatmul_numpy(x, blocks, tallow.get_dtype(qtype), n, k), rtol=1e-4, atol=1e-3)
    emb = wt.index_select(0, tallow.tensor([3, 0, 63], device=device)).numpy()
    np.testing.assert_allclose(emb, wt.to("cpu").to(tallow.f32).numpy()[[3, 0, 63]], rtol=1e-6)


def test_attention_over_a_kv_cache_view(device):
    """Keys longer than queries, read through a narrowed cache and GQA-expanded heads."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 3, 64)).astype(np.float32)
    cache = rng.standard_normal((1, 2, 40, 64)).astype(np.float32)
    k = tallow.from_numpy(cache, device=device).narrow(2, 0, 30)
    v = tallow.from_numpy(cache[:, :, ::-1].copy(), device=device).narrow(2, 0, 30)
    got = tallow.scaled_dot_product_attention(tallow.from_numpy(q, device=device), k, v, is_causal=True).numpy()
    ref = tallow.scaled_dot_product_attention(tallow.from_numpy(q, device="cpu"), k.to("cpu"), v.to("cpu"), is_causal=True).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_fused_ops_match_numpy_backend(device, dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 300)).astype(np.float32)
    x_cpu = tallow.from_numpy(a).to(dtype)
    x = x_cpu.to(device)
    tol = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[dtype]
    for fn in (lambda t: t.softmax(-1), lambda t: t.log_softmax(-1), lambda t: tallow.rms_norm(t, None, 1e-6),
               lambda t: t.sum(0), lambda t: t.max(1), lambda t: t.cumsum(1), lambda t: t.T.argmax(0)):
        np.testing.assert_allclose(fn(x).numpy().astype(np.float64), fn(x_cpu).numpy().astype(np.float64), rtol=tol, atol=tol)


def test_zz_the_suite_ran_on_the_cuda_kernels(cuda_device):
    """Not vacuous: the tests above launched the CUDA kernels (counted by the emulator)."""
    driver = cuda_device.backend.driver
    if not hasattr(driver, "launches"):
        pytest.skip("a real GPU: launches are not counted")
    if driver.launches == 0:
        pytest.skip("run with the whole module: this counts the kernel launches of the tests above")
    assert driver.launches > 300
