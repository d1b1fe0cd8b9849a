"""Bad weight files: every corruption is a tallow.Error naming the file (and tensor),
never a crash, a hang, or a large allocation. Hand-made cases, then a bounded
hypothesis fuzz over mutated real files."""
import json
import os
import struct
import tracemalloc

import numpy as np
import pytest

import tallow.io as tio
from tallow.errors import Error, FormatError

import gguf_files

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

st_numpy = pytest.importorskip("safetensors.numpy")
gguf = pytest.importorskip("gguf")


def _safetensors_bytes(header, data=b""):
    blob = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(blob)) + blob + data


def _refused(data, match, tmp_path, name="bad.safetensors"):
    p = tmp_path / name
    p.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=match) as e:
            f = tio.open(p)
            for k in f.keys():
                f.tensor(k)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(p) in str(e.value)  # the message names the file
    assert peak < 4 << 20, f"{peak} bytes allocated while refusing"
    return str(e.value)


# -- safetensors, hand-made ------------------------------------------------------

def test_safetensors_truncated_and_bad_headers(tmp_path):
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    _refused(b"\x01\x02", "truncated", tmp_path)
    _refused(b"", "truncated", tmp_path)
    _refused(struct.pack("<Q", 1 << 40) + b"{}", "larger than", tmp_path)
    _refused(struct.pack("<Q", 1000) + b"{}", "runs past the end", tmp_path)
    _refused(_safetensors_bytes(good, b"\0" * 15), r"'w'.*run past the end", tmp_path)
    _refused(_safetensors_bytes(b'{"w": \xff\xfe}'), "not UTF-8", tmp_path)
    _refused(_safetensors_bytes(b"{not json"), "not valid JSON", tmp_path)
    _refused(_safetensors_bytes(b"[1, 2]"), "not a JSON object", tmp_path)
    _refused(_safetensors_bytes({"__metadata__": {"a": 1}}), "strings to strings", tmp_path)


def test_safetensors_bad_tensor_entries(tmp_path):
    def one(entry, data=b"\0" * 64):
        return _safetensors_bytes({"w": entry}, data)
    _refused(one({"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}), r"'w'.*unknown dtype 'Q9'", tmp_path)
    _refused(one({"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}), r"'w'.*needs 20 bytes", tmp_path)
    _refused(one({"dtype": "F32", "shape": [10 ** 6, 10 ** 6], "data_offsets": [0, 16]}), r"needs 4000000000000 bytes",
             tmp_path)
    _refused(one({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}), "non-negative", tmp_path)
    _refused(one({"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}), "begin <= end", tmp_path)
    _refused(one({"dtype": "F32", "shape": [4]}), "data_offsets", tmp_path)
    _refused(one({"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}), "past the end", tmp_path)
    two = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    _refused(_safetensors_bytes(two, b"\0" * 24), r"overlaps tensor", tmp_path)


# -- GGUF, hand-made ---------------------------------------------------------------

def test_gguf_bad_headers(tmp_path):
    cases = [
        (b"GGUF\x03\0\0", "truncated"),
        (b"GGML" + b"\0" * 30, "not a GGUF file"),
        (gguf_files.raw(version=1), "version 1"),
        (gguf_files.raw(n_tensors=1 << 60), "tensor count"),
        (gguf_files.raw(n_kv=1 << 62), "metadata count"),
        (gguf_files.raw(gguf_files.kv(b"k", 8, struct.pack("<Q", 1 << 50)), 1), "truncated"),
        (gguf_files.raw(gguf_files.kv(b"k", 8, struct.pack("<Q", 2) + b"\xff\xfe"), 1), r"'k'.*not UTF-8"),
        (gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 4, 1 << 61)), 1), "array count"),
        (gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 77, 1)), 1), "unknown array element type"),
        (gguf_files.raw(gguf_files.kv(b"k", 42, b""), 1), "unknown value type 42"),
        (gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 9, 1) * 40), 1), "nested deeper"),
        (gguf_files.raw(gguf_files.kv(b"general.alignment", 4, struct.pack("<I", 48)), 1), "power of two"),
    ]
    for data, match in cases:
        _refused(data, match, tmp_path, "bad.gguf")


def test_gguf_metadata_work_is_bounded(tmp_path):
    """Counts that fit in the file but would build millions of Python objects are refused up front."""
    from tallow.io.gguf import MAX_METADATA_VALUES, MAX_NESTED_ARRAYS, MAX_TENSORS
    n = MAX_METADATA_VALUES + 1  # u8 values: one byte each, so the count fits the file
    _refused(gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 0, n) + b"\0" * n), 1), r"'k'.*more than 4194304 values",
             tmp_path, "bad.gguf")
    n = MAX_NESTED_ARRAYS + 1
    _refused(gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 9, n) + struct.pack("<IQ", 4, 0) * n), 1),
             r"'k'.*more than 65536 arrays nested", tmp_path, "bad.gguf")
    _refused(gguf_files.raw(n_tensors=MAX_TENSORS + 1, data=b"\0" * (24 * (MAX_TENSORS + 1))),
             r"tensor count 262145 is more than the 262144", tmp_path, "bad.gguf")


def test_gguf_bad_tensors(tmp_path):
    data = b"\0" * 128
    cases = [
        ([(b"w", [4], 0, 0), (b"w", [4], 0, 64)], "duplicate tensor"),
        ([(b"w", [4], 99, 0)], r"'w'.*unknown ggml type id 99"),
        ([(b"w", [4], 0, 8)], "not a multiple of the alignment"),
        ([(b"w", [40], 2, 0)], r"'w'.*block size 32"),
        ([(b"w", [10 ** 6, 10 ** 6], 0, 0)], r"'w'.*outside the file"),
        ([(b"w", [64], 0, 0)], "outside the file"),
        ([(b"a", [16], 0, 0), (b"b", [16], 0, 32)], "overlaps"),
        ([(b"w", [1] * 9, 0, 0)], "9 dimensions"),
    ]
    for tensors, match in cases:
        _refused(gguf_files.raw(tensors=tensors, data=data), match, tmp_path, "bad.gguf")


def test_gguf_unsupported_quant_type_is_named(tmp_path):
    p = tmp_path / "iq.gguf"
    p.write_bytes(gguf_files.raw(tensors=[(b"w", [256], 16, 0), (b"ok", [4], 0, 96)], data=b"\0" * 128))
    f = tio.open(p)  # listing works; only loading the IQ2_XXS tensor fails
    assert f.info("w").file_dtype == "IQ2_XXS" and f.info("w").nbytes == 66
    assert f.tensor("ok").tolist() == [0.0] * 4
    with pytest.raises(FormatError, match=r"iq.gguf: tensor 'w': ggml type IQ2_XXS is not supported"):
        f.tensor("w")


# -- fuzz over mutated real files ------------------------------------------------------

def _small_safetensors():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "s.safetensors")
        st_numpy.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.int64),
                            "c": np.ones((2, 2), np.float16)}, p, metadata={"k": "v"})
        return open(p, "rb").read()


def _small_gguf():
    def metadata(w):
        w.add_uint32("n", 3)
        w.add_string("s", "x")
        w.add_array("arr", ["ab", "c"])
        w.add_array("nested", [[1], [2, 3]])
    return gguf_files.gguf_bytes("llama", metadata, {"f": np.ones((2, 3), np.float32),
                                                     "q": (np.ones((2, 32), np.float32), "q8_0")})


SMALL = {"safetensors": _small_safetensors(), "gguf": _small_gguf()}


def _open_everything(data):
    """Open and load every tensor; only tallow errors may come out."""
    try:
        f = tio.open(data)
        for k in f.keys():
            f.info(k)
            f.tensor(k)
    except Error:
        pass


def _mutate(data, edits, cut):
    b = bytearray(data)
    for pos, value in edits:
        b[pos % len(b)] = value
    return bytes(b[:cut]) if cut is not None else bytes(b)


@pytest.mark.parametrize("kind", sorted(SMALL))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(edits=st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)), max_size=6),
       cut=st.none() | st.integers(0, 2000))
def test_fuzz_small_files(kind, edits, cut):
    data = _mutate(SMALL[kind], edits, cut)
    tracemalloc.start()
    try:
        _open_everything(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.fixture(scope="module")
def smollm2_header(smollm2_gguf):
    """The real SmolLM2 GGUF's header (metadata and tensor infos), without the weights."""
    f = tio.open(str(smollm2_gguf))
    with open(smollm2_gguf, "rb") as fh:
        return fh.read(f.data_start)


def test_fuzz_smollm2_header(smollm2_header):
    """Mutations in the counts, the first metadata entries and the tensor-info table of the real header."""
    head = smollm2_header
    tail_from = head.rindex(b"token_embd.weight") - 8  # the tensor infos start here
    regions = st.one_of(st.integers(0, 2048), st.integers(tail_from, len(head) - 1))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(edits=st.lists(st.tuples(regions, st.integers(0, 255)), min_size=1, max_size=4),
           cut=st.none() | st.integers(0, len(head)))
    def run(edits, cut):
        _open_everything(_mutate(head, edits, cut))
    run()
