"""The optional capabilities every backend declares in the contract (tallow.backends.base),
with defaults: to_numpy, from_js_buffer (custom is in test_custom_op.py); and the model kind
that front ends read instead of guessing from attributes."""

import numpy as np
import pytest

import tallow
from tallow.backends.base import Backend
from tallow.layout import Layout

torch = pytest.importorskip("torch")

CASES = {  # tallow dtype -> (numpy dtype Tensor.numpy returns, torch dtype giving the reference rounding)
    "f32": (np.float32, torch.float32), "f16": (np.float16, torch.float16), "bf16": (np.float32, torch.bfloat16),
    "i64": (np.int64, torch.int64), "i32": (np.int32, torch.int32), "u8": (np.uint8, torch.uint8),
    "bool": (np.bool_, torch.bool),
}


def values(dtype):
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.integers(0, 2, (3, 4)).astype(bool)
    if dtype in ("i64", "i32", "u8"):
        return rng.integers(0, 100, (3, 4)).astype(np.int64)
    return (rng.standard_normal((3, 4)) * 10).astype(np.float32)


@pytest.mark.parametrize("dtype", sorted(CASES))
def test_numpy_of_a_transposed_view_is_a_copy_in_numpys_dtype(device, dtype):
    np_dtype, torch_dtype = CASES[dtype]
    a = values(dtype)
    t = tallow.from_numpy(a, device).to(dtype).T
    got = t.numpy()
    want = torch.from_numpy(a).to(torch_dtype).T
    want = (want.float() if torch_dtype is torch.bfloat16 else want).numpy()
    assert got.dtype == np_dtype and got.shape == (4, 3)
    np.testing.assert_array_equal(got, want)
    got[...] = 0  # a copy: writing to it leaves the tensor alone
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("dtype", sorted(CASES))
def test_the_contracts_default_to_numpy_agrees_with_the_numpy_backends(dtype):
    cpu = tallow.Device("cpu").backend
    t = tallow.from_numpy(values(dtype)).to(dtype)
    view = Layout((2, 4), (1, 4), 1)  # a strided window with an offset
    ours = Backend.to_numpy(cpu, t._storage, view, t.dtype)  # the default: through to_bytes
    override = cpu.to_numpy(t._storage, view, t.dtype)
    assert ours.dtype == override.dtype
    np.testing.assert_array_equal(ours, override)


def test_numpy_backend_can_lend_a_read_only_view():
    t = tallow.arange(12, dtype=tallow.f32).reshape(3, 4)
    view = tallow.Device("cpu").backend.to_numpy(t._storage, t._layout, t.dtype, copy=False)
    assert np.shares_memory(view, t._storage) and not view.flags.writeable
    np.testing.assert_array_equal(view, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_from_js_buffer_is_declined_without_a_browser(device):
    """None means 'read the bytes and use from_bytes' (tallow.io.byte_source.direct_tensor)."""
    assert device.backend.from_js_buffer(object(), 0, 8, tallow.f32) is None


def test_models_declare_their_kind():
    from tallow.models.architectures import by_model_type, known
    from tallow.models.whisper import Whisper
    assert Whisper.kind == "whisper"
    for model_type in known():
        assert by_model_type(model_type, "test").model_class.kind == "llm"


@pytest.mark.parametrize("host", ["cpu", "python"])
def test_host_dequantisation_agrees_with_ggml_reference(host, monkeypatch):
    """GPU backends hand block formats their kernels do not read to the host backend,
    whichever it is (numpy's, or pure Python's where numpy is missing)."""
    from tallow.backends import host as host_module
    from tallow.quant import dequantize_numpy, quantize_numpy
    monkeypatch.setattr(host_module, "host_device", lambda: tallow.Device(host))
    q5 = tallow.get_dtype("q5_0")
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    blocks = quantize_numpy(w, q5).tobytes()
    want = dequantize_numpy(np.frombuffer(blocks, np.uint8), q5, w.size).reshape(4, 64)
    got = np.frombuffer(host_module.dequantize_on_host(blocks, q5, w.size), "<f4").reshape(4, 64)
    np.testing.assert_array_equal(got, want)
    ids = np.array([3, 0, 3], np.int64).tobytes()
    rows = np.frombuffer(host_module.dequantize_rows_on_host(blocks, q5, 64, ids), "<f4").reshape(3, 64)
    np.testing.assert_array_equal(rows, want[[3, 0, 3]])
