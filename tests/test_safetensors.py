"""safetensors (and npz, and the common tallow.io interface) against the
`safetensors` library and numpy, which write and read the reference files."""
import json
import os
import tracemalloc

import numpy as np
import pytest

import tallow
import tallow.io as tio
from tallow.errors import FormatError

st_numpy = pytest.importorskip("safetensors.numpy")

ARRAYS = {
    "f64": np.linspace(-1, 1, 6).reshape(2, 3),
    "f32": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
    "f16": np.array([[1.5, -2.25], [65504, 6e-8]], np.float16),
    "i64": np.array([-(2 ** 62), 0, 2 ** 62]),
    "i32": np.arange(-3, 3, dtype=np.int32).reshape(3, 2),
    "i8": np.array([-128, 0, 127], np.int8),
    "u8": np.arange(5, dtype=np.uint8),
    "u32": np.array([0, 2 ** 32 - 1], np.uint32),
    "bool": np.array([[True, False, True]]),
    "scalar": np.array(3.5, np.float32),
    "empty": np.zeros((0, 7), np.float32),
}


def test_library_files_load_in_tallow(tmp_path):
    p = tmp_path / "lib.safetensors"
    st_numpy.save_file(ARRAYS, str(p), metadata={"format": "np", "note": "ünïcode"})
    f = tio.open(p)
    assert sorted(f.keys()) == sorted(ARRAYS) and f.metadata == {"format": "np", "note": "ünïcode"}
    for name, arr in ARRAYS.items():
        info = f.info(name)
        assert info.shape == arr.shape and info.nbytes == arr.nbytes
        assert bytes(f.raw(name)) == arr.tobytes()
        t = f.tensor(name)
        assert t.dtype is tallow.get_dtype(arr.dtype.name) and t.shape == arr.shape
        np.testing.assert_array_equal(t.numpy(), arr)
    loaded = tio.load_file(p, device="python")
    np.testing.assert_array_equal(loaded["f16"].numpy(), ARRAYS["f16"])


def test_tallow_files_load_in_library(tmp_path):
    tensors = {name: tallow.from_numpy(arr) for name, arr in ARRAYS.items()}
    p = tmp_path / "ours.safetensors"
    tio.save_file(tensors, p, metadata={"who": "tallow"})
    back = st_numpy.load_file(str(p))
    assert sorted(back) == sorted(ARRAYS)
    for name, arr in ARRAYS.items():
        assert back[name].dtype == arr.dtype
        np.testing.assert_array_equal(back[name], arr)
    from safetensors import safe_open
    with safe_open(str(p), "np") as f:
        assert f.metadata() == {"who": "tallow"}


def test_bf16_both_ways(tmp_path):
    torch = pytest.importorskip("torch")
    import safetensors.torch as st_torch
    x = torch.randn(4, 5).to(torch.bfloat16)
    st_torch.save_file({"x": x}, str(tmp_path / "a.safetensors"))
    t = tio.open(tmp_path / "a.safetensors").tensor("x")
    assert t.dtype is tallow.bf16
    np.testing.assert_array_equal(t.to(tallow.f32).numpy(), x.float().numpy())
    tio.save_file({"y": t}, tmp_path / "b.safetensors")
    assert torch.equal(st_torch.load_file(str(tmp_path / "b.safetensors"))["y"], x)


def test_low_level_writer_inputs(tmp_path):
    p = tmp_path / "mixed.safetensors"
    tio.write_safetensors(p, {"np": np.ones((2, 2), np.float32),
                              "triple": ("i32", (3,), np.arange(3, dtype=np.int32).tobytes()),
                              "tensor": tallow.tensor([1.0, 2.0])})
    back = st_numpy.load_file(str(p))
    np.testing.assert_array_equal(back["triple"], [0, 1, 2])
    with pytest.raises(FormatError, match="needs 12"):
        tio.write_safetensors(p, {"bad": ("f32", (3,), b"\0" * 8)})
    with pytest.raises(FormatError, match="cannot store q4_0"):
        tio.write_safetensors(p, {"q": ("q4_0", (32,), b"\0" * 18)})


def test_unsupported_dtypes_are_refused_clearly(tmp_path):
    p = tmp_path / "i16.safetensors"
    st_numpy.save_file({"ok": np.ones(2, np.float32), "small": np.ones(3, np.int16), "big": np.ones(2, np.uint64)},
                       str(p))
    f = tio.open(p)
    assert f.info("small").file_dtype == "I16" and f.info("small").dtype is None
    np.testing.assert_array_equal(f.tensor("ok").numpy(), [1, 1])
    with pytest.raises(FormatError, match=r"'small'.*I16 is not supported"):
        f.tensor("small")
    with pytest.raises(FormatError, match=r"'big'.*U64"):
        f.raw("big")


def test_sharded_checkpoint(tmp_path):
    a = {"layer.0.w": np.ones((2, 3), np.float32)}
    b = {"layer.1.w": np.full((3,), 2, np.float16), "head": np.arange(4, dtype=np.int64)}
    st_numpy.save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    st_numpy.save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 42}, "weight_map": {**{k: "model-00001-of-00002.safetensors" for k in a},
                                                             **{k: "model-00002-of-00002.safetensors" for k in b}}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for source in (tmp_path, tmp_path / "model.safetensors.index.json"):
        f = tio.open(source)
        assert sorted(f.keys()) == sorted([*a, *b]) and f.metadata == {"total_size": 42}
        for name, arr in {**a, **b}.items():
            np.testing.assert_array_equal(f.tensor(name).numpy(), arr)
    loaded = tio.load_file(tmp_path)
    assert loaded["head"].tolist() == [0, 1, 2, 3]


def test_opening_a_huge_file_allocates_nothing(tmp_path):
    """A 1 GiB file (sparse on disk): opening and listing it must not read the data."""
    p = tmp_path / "huge.safetensors"
    n = 1 << 28  # f32 elements: 1 GiB
    header = json.dumps({"big": {"dtype": "F32", "shape": [1 << 14, 1 << 14], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(p, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 4 * n)
    tracemalloc.start()
    try:
        f = tio.open(p)
        info = f.info("big")
        view = f.raw("big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.nbytes == 4 * n and len(view) == 4 * n
    assert peak < 1 << 20, f"opening allocated {peak} bytes"
    assert os.stat(p).st_blocks * 512 < 1 << 20  # the file really is sparse: nothing was written or read


def test_open_buffer_and_sniffing(tmp_path):
    p = tmp_path / "no_extension"
    st_numpy.save_file({"x": np.arange(3, dtype=np.float32)}, str(p))
    assert tio.open(p).tensor("x").tolist() == [0.0, 1.0, 2.0]
    f = tio.open(p.read_bytes())  # e.g. bytes fetched in the browser
    assert f.tensor("x").tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(FormatError, match="save_file writes"):
        tio.save_file({}, tmp_path / "x.bin")
    with pytest.raises(FormatError, match="cannot open"):
        tio.open(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("saver", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
def test_npz_matches_numpy(tmp_path, saver):
    arrays = {k: v for k, v in ARRAYS.items()}
    p = tmp_path / "a.npz"
    saver(p, **arrays)
    f = tio.open(p)
    assert sorted(f.keys()) == sorted(arrays)
    with np.load(p) as ref:
        for name in arrays:
            assert bytes(f.raw(name)) == ref[name].tobytes()
            np.testing.assert_array_equal(f.tensor(name).numpy(), ref[name])


def test_npz_refuses_what_it_cannot_hold(tmp_path):
    p = tmp_path / "b.npz"
    np.savez(p, fortran=np.asfortranarray(np.ones((2, 3), np.float32)), big_endian=np.ones(2, ">f4"),
             ok=np.ones(2, np.float32))
    f = tio.open(p)
    np.testing.assert_array_equal(f.tensor("ok").numpy(), [1, 1])
    with pytest.raises(FormatError, match="Fortran"):
        f.tensor("fortran")
    with pytest.raises(FormatError, match="'>f4' is not supported"):
        f.tensor("big_endian")


def test_whisper_mel_filters_npz(whisper_assets_dir):
    """The real mel_filters.npz (openai-whisper's, fetched into the tallow cache as whisper-assets)."""
    path = whisper_assets_dir / "mel_filters.npz"
    f = tio.open(path)
    with np.load(path) as ref:
        for name in ref.files:
            np.testing.assert_array_equal(f.tensor(name).numpy(), ref[name])
