"""GGUF reading and writing against the `gguf` package (GGUFWriter / GGUFReader)
and the real SmolLM2-135M GGUF."""

import numpy as np
import pytest

import tallow
import tallow.io as tio
from tallow.errors import FormatError
from tallow.io.gguf import GGUFFile, write_gguf
from tallow.quant import dequantize_numpy, dequantize_python, quantize_numpy

import gguf_files

gguf = pytest.importorskip("gguf")
from gguf.constants import GGMLQuantizationType as T, GGUFValueType as V  # noqa: E402


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return str(smollm2_gguf)


@pytest.fixture(scope="module")
def library_file(tmp_path_factory):
    """A GGUF written by gguf.GGUFWriter with every metadata type and several tensor types."""
    path = str(tmp_path_factory.mktemp("gguf") / "lib.gguf")

    def metadata(w):
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -100)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4_000_000_000)
        w.add_int32("t.i32", -2_000_000_000)
        w.add_float32("t.f32", 0.1)
        w.add_uint64("t.u64", 2 ** 63 + 5)
        w.add_int64("t.i64", -(2 ** 62))
        w.add_float64("t.f64", 0.1)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_array("t.strs", ["a", "", "ü"])
        w.add_array("t.ints", [1, 2, 3])
        w.add_key_value("t.floats", [0.5, -1.25], V.ARRAY, V.FLOAT32)
        w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((2, 4)).astype(np.float16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "vec": rng.standard_normal(7).astype(np.float32),
        "cube": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }
    w_q = rng.standard_normal((4, 256)).astype(np.float32)
    for q in ("q8_0", "q4_0", "q4_1"):
        tensors[f"w_{q}"] = (w_q, q)
    gguf_files.write(path, "llama", metadata, tensors)
    return path


def _reader_metadata(r):
    return {name: f.contents() for name, f in r.fields.items() if not name.startswith("GGUF.")}


def _flatten(v):
    """GGUFReader's contents() flattens arrays of arrays; compare ours the same way."""
    if isinstance(v, list) and v and isinstance(v[0], list):
        return [x for item in v for x in _flatten(item)]
    return v


def _check_against_reader(path):
    f = GGUFFile(path)
    r = gguf.GGUFReader(path)
    assert {k: _flatten(v) for k, v in f.metadata.items()} == _reader_metadata(r)
    assert f.keys() == [t.name for t in r.tensors]
    for t in r.tensors:
        info = f.info(t.name)
        assert bytes(f.raw(t.name)) == t.data.tobytes(), t.name
        assert info.file_dtype == t.tensor_type.name
        assert info.shape == tuple(int(d) for d in reversed(t.shape))  # row-major
    return f, r


def test_library_file_matches_reader(library_file):
    f, r = _check_against_reader(library_file)
    assert f.version == 3
    assert f.metadata["t.nested"] == [[1, 2], [3]]
    assert f.metadata_types["t.u16"] == 2 and f.metadata_types["t.strs"] == (9, 8)
    assert f.metadata_types["t.nested"][0] == 9
    np.testing.assert_array_equal(f.tensor("cube").numpy(), r.get_tensor(next(
        i for i, t in enumerate(r.tensors) if t.name == "cube")).data)


def test_quantised_tensors_load_as_block_dtypes(library_file):
    f = GGUFFile(library_file)
    for q in ("q8_0", "q4_0", "q4_1"):
        t = f.tensor(f"w_{q}")
        assert t.dtype is tallow.get_dtype(q) and t.shape == (4, 256)
        ref = gguf.quants.dequantize(np.frombuffer(f.raw(f"w_{q}"), np.uint8).reshape(4, -1), T[q.upper()])
        np.testing.assert_array_equal(t.to(tallow.f32).numpy(), ref)


def test_rewrite_reproduces_library_file(library_file, tmp_path):
    f = GGUFFile(library_file)
    out = tmp_path / "copy.gguf"
    write_gguf(out, {n: (i.dtype.name, i.shape, f.raw(n)) for n, i in f.infos.items()}, f.metadata, f.metadata_types)
    assert out.read_bytes() == open(library_file, "rb").read()


def test_written_file_reads_in_library(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 256)).astype(np.float32)
    tensors = {"emb": tallow.from_numpy(w).to(tallow.get_dtype("q4_k")), "norm": np.ones(256, np.float32),
               "ids": ("i64", (3,), np.arange(3, dtype=np.int64).tobytes()), "half": np.ones((2, 2), np.float16)}
    meta = {"general.architecture": "llama", "x.count": 7, "x.neg": -3, "x.ratio": 0.25, "x.flag": False,
            "x.names": ["a", "b"], "x.big": 2 ** 40, "x.empty": []}
    p = tmp_path / "ours.gguf"
    tio.save_file(tensors, p, metadata=meta)
    r = gguf.GGUFReader(str(p))
    got = _reader_metadata(r)
    assert got == meta
    assert GGUFFile(p).metadata == meta
    assert r.fields["x.count"].types == [V.UINT32] and r.fields["x.neg"].types == [V.INT32]
    assert r.fields["x.big"].types == [V.UINT64]
    by_name = {t.name: t for t in r.tensors}
    assert by_name["emb"].tensor_type == T.Q4_K
    np.testing.assert_array_equal(gguf.quants.dequantize(by_name["emb"].data, T.Q4_K),
                                  tensors["emb"].to(tallow.f32).numpy())
    np.testing.assert_array_equal(by_name["ids"].data, [0, 1, 2])
    loaded = tio.load_file(p)
    assert loaded["emb"].dtype is tallow.get_dtype("q4_k") and loaded["half"].dtype is tallow.f16


def test_custom_alignment(tmp_path):
    p = tmp_path / "a64.gguf"
    write_gguf(p, {"a": np.ones(3, np.float32), "b": np.ones(5, np.float32)}, {"k": 1}, alignment=64)
    f = GGUFFile(p)
    assert f.alignment == 64 and f.metadata["general.alignment"] == 64
    assert all((i.offset - f.data_start) % 64 == 0 for i in f.infos.values())
    _check_against_reader(str(p))
    with pytest.raises(FormatError, match="power of two"):
        write_gguf(p, {}, alignment=48)


def test_smollm2_matches_reader(smollm2):
    f, r = _check_against_reader(smollm2)
    assert f.metadata["general.architecture"] == "llama" and len(f.metadata["tokenizer.ggml.tokens"]) == 49152
    assert f.info("token_embd.weight").shape == (49152, 576)
    assert f.info("token_embd.weight").dtype is tallow.get_dtype("q8_0")
    assert f.info("blk.0.ffn_down.weight").shape == (576, 1536)


def test_smollm2_rewrite_is_byte_identical(smollm2, tmp_path):
    f = GGUFFile(smollm2)
    out = tmp_path / "copy.gguf"
    write_gguf(out, {n: (i.dtype.name, i.shape, f.raw(n)) for n, i in f.infos.items()}, f.metadata, f.metadata_types)
    with open(smollm2, "rb") as a, open(out, "rb") as b:
        while True:
            x, y = a.read(1 << 24), b.read(1 << 24)
            assert x == y
            if not x:
                break


def test_smollm2_tensors_dequantise_like_gguf(smollm2):
    f = GGUFFile(smollm2)
    for name in ("token_embd.weight", "blk.0.ffn_down.weight", "blk.3.attn_q.weight"):
        info = f.info(name)
        k = info.shape[-1]
        rows = np.frombuffer(f.raw(name), np.uint8).reshape(info.shape[0], -1)[:8]
        ref = gguf.quants.dequantize(rows, T[info.file_dtype])
        np.testing.assert_array_equal(dequantize_numpy(rows, info.dtype, 8 * k).reshape(8, k), ref)
        np.testing.assert_array_equal(np.frombuffer(dequantize_python(rows.tobytes(), info.dtype, 8 * k), np.float32),
                                      ref.reshape(-1))
    rows = np.frombuffer(f.raw("token_embd.weight"), np.uint8).reshape(49152, -1)[[1, 100, 49151]]
    for device in ("cpu", "python"):
        emb = f.tensor("token_embd.weight", device=device)
        got = emb.index_select(0, tallow.tensor([1, 100, 49151], device=device))
        np.testing.assert_array_equal(got.numpy(), gguf.quants.dequantize(rows, T.Q8_0))


def test_quantize_cli(tmp_path):
    from tallow.cli import main
    st_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(2)
    src = {"w": rng.standard_normal((16, 512)).astype(np.float32),
           "odd": rng.standard_normal((4, 100)).astype(np.float32),
           "norm": np.ones(512, np.float32), "pos": np.arange(4, dtype=np.int64), "f64": np.ones((2, 256))}
    st_numpy.save_file(src, str(tmp_path / "in.safetensors"), metadata={"source": "test"})
    assert main(["quantize", str(tmp_path / "in.safetensors"), str(tmp_path / "out.gguf"), "--type", "q4_k"]) == 0
    r = gguf.GGUFReader(str(tmp_path / "out.gguf"))
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types == {"w": T.Q4_K, "odd": T.F32, "norm": T.F32, "pos": T.I64, "f64": T.Q4_K}
    w = next(t for t in r.tensors if t.name == "w")
    np.testing.assert_array_equal(gguf.quants.dequantize(w.data, T.Q4_K),
                                  dequantize_numpy(quantize_numpy(src["w"], "q4_k"), "q4_k",
                                                   src["w"].size).reshape(16, 512))
    assert r.fields["source"].contents() == "test"
    assert main(["quantize", str(tmp_path / "in.safetensors"), str(tmp_path / "o2.gguf"), "--type", "q8_0"]) == 0
    assert main(["quantize", str(tmp_path / "missing.safetensors"), str(tmp_path / "o3.gguf")]) == 2
