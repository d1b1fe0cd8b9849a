"""GGUF tensors declared with the wrong type: the tensors must account for the data section
(each one's bytes up to the next tensor's offset, the last one's up to the end of the file,
with only alignment padding between), so a tensor relabelled to a smaller type (Q4_0 over
Q8_0 data, F16 over F32, a K-quant relabelled) is refused naming it, before any kernel reads
the wrong bytes; one relabelled larger still overlaps its neighbour (the older check).

The files: scripts/make_synthetic_gguf.py's tiny qwen2 with llama.cpp's Q4_K_M mix (written
by the `gguf` package: F32, Q5_0, Q8_0, Q4_K, Q6_K), a tiny llama written by tallow's own writer,
and the real SmolLM2 Q4_1 file; the unmodified ones load.
"""
import os
import struct
import sys

import numpy as np
import pytest

import tallow
from tallow.cli import main as cli_main
from tallow.errors import FormatError
from tallow.io.gguf import GGUFFile, write_gguf
from tallow.quant.formats import GGML_TYPES

import gguf_files

gguf = pytest.importorskip("gguf")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_synthetic_gguf as maker  # noqa: E402

sys.path.pop(0)

TYPE_ID = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}


@pytest.fixture(scope="module")
def qwen2_blob(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2") / "qwen2-tiny.gguf"
    maker.write(path, "qwen2", "q4_k_m", scale=1 / 32, layers=2, seed=5)
    return path.read_bytes()


def _relabel(blob, name, type_name):
    """A copy of the file with tensor `name` declared as `type_name` (its data untouched)."""
    return gguf_files.relabel(blob, name, TYPE_ID[type_name])


def _declared(blob, name):
    return GGML_TYPES[struct.unpack_from("<I", blob, gguf_files.type_offset(blob, name))[0]][0]


RELABELLED_SMALLER = [  # (tensor, stored type, declared type)
    ("blk.1.attn_v.weight", "Q8_0", "Q4_0"),  # the attn_q case: Q4_0 over Q8_0 data
    ("blk.0.attn_norm.weight", "F32", "F16"),
    ("blk.1.ffn_down.weight", "Q6_K", "Q4_K"),
    ("blk.0.ffn_down.weight", "Q4_K", "Q3_K"),
    ("blk.1.attn_q.weight", "Q5_0", "Q4_0"),
    ("token_embd.weight", "Q8_0", "Q5_1"),
]


@pytest.mark.parametrize("name,stored,declared", RELABELLED_SMALLER)
def test_tensor_declared_smaller_than_its_data_is_refused(tmp_path, qwen2_blob, name, stored, declared):
    assert _declared(qwen2_blob, name) == stored
    path = tmp_path / "relabelled.gguf"
    path.write_bytes(_relabel(qwen2_blob, name, declared))
    pattern = rf"{path}: tensor '{name}': declared {declared} \[.*\], which is \d+ bytes, but \d+ bytes are stored"
    with pytest.raises(FormatError, match=pattern):
        GGUFFile(path)
    with pytest.raises(FormatError, match=pattern):
        tallow.load_model(path, device="cpu")


@pytest.mark.parametrize("name,stored,declared", [
    ("blk.1.attn_v.weight", "Q8_0", "F16"),
    ("blk.0.ffn_down.weight", "Q4_K", "Q5_K"),
    ("blk.1.ffn_down.weight", "Q6_K", "Q8_0"),
    ("blk.1.attn_q.weight", "Q5_0", "Q5_1"),
])
def test_tensor_declared_larger_than_its_data_is_still_refused(tmp_path, qwen2_blob, name, stored, declared):
    assert _declared(qwen2_blob, name) == stored
    path = tmp_path / "relabelled.gguf"
    path.write_bytes(_relabel(qwen2_blob, name, declared))
    with pytest.raises(FormatError, match=rf"{path}: tensor '.*': data \[\d+, \d+\) (overlaps|lies outside)"):
        GGUFFile(path)


def test_cli_names_the_relabelled_tensor_in_one_line(tmp_path, qwen2_blob, capsys):
    path = tmp_path / "relabelled.gguf"
    path.write_bytes(_relabel(qwen2_blob, "blk.1.attn_v.weight", "Q4_0"))
    assert cli_main(["generate", "--model", str(path), "--max-tokens", "4", "Hello"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "blk.1.attn_v.weight" in captured.err and str(path) in captured.err
    assert captured.err.startswith("tallow generate: error: "), captured.err


def test_last_tensor_declared_smaller_leaves_the_file_end_unaccounted(tmp_path, qwen2_blob):
    f = GGUFFile(_write(tmp_path / "ok.gguf", qwen2_blob))
    last = max(f.infos.values(), key=lambda i: i.offset)
    assert f.size - (last.offset + last.nbytes) < f.alignment  # the writer pads the last tensor only
    f.close()
    smaller = {"F32": "F16", "Q8_0": "Q4_0", "Q6_K": "Q4_K", "Q5_0": "Q4_0"}[last.file_dtype]
    path = _write(tmp_path / "last.gguf", _relabel(qwen2_blob, last.name, smaller))
    with pytest.raises(FormatError, match=rf"tensor '{last.name}': declared {smaller}.*before the end of the file"):
        GGUFFile(path)


def test_bytes_no_tensor_claims_are_refused(tmp_path):
    """Stray bytes past the last tensor, or before the first, are data no tensor accounts for."""
    ok = tmp_path / "ok.gguf"
    write_gguf(ok, {"a": np.ones(8, np.float32), "b": np.ones(16, np.float32)}, {"k": 1})
    f = GGUFFile(ok)
    start, size = f.data_start, f.size
    f.close()
    blob = ok.read_bytes()
    grown = _write(tmp_path / "grown.gguf", blob + bytes(32))
    with pytest.raises(FormatError, match=r"tensor 'b': declared F32 \[16\], which is 64 bytes, but 96 bytes"):
        GGUFFile(grown)
    assert GGUFFile(_write(tmp_path / "padded.gguf", blob + bytes(31))).keys() == ["a", "b"]  # under one alignment
    # both offsets moved up by 64 (the u64 offsets are the last field of each tensor info)
    shifted = bytearray(blob[:start] + bytes(64) + blob[start:])
    for name in ("a", "b"):
        pos = gguf_files.type_offset(blob, name) + 4
        struct.pack_into("<Q", shifted, pos, struct.unpack_from("<Q", blob, pos)[0] + 64)
    with pytest.raises(FormatError, match=r"tensor 'a': 64 bytes at the start of the data section belong to no"):
        GGUFFile(_write(tmp_path / "shifted.gguf", bytes(shifted)))
    assert size - start == 96


def _write(path, blob):
    path.write_bytes(blob)
    return path


def test_unmodified_files_load(tmp_path, qwen2_blob, smollm2_gguf):
    """The files both writers make, and the real SmolLM2 Q4_1, account for their data exactly."""
    model = tallow.load_model(_write(tmp_path / "qwen2.gguf", qwen2_blob), device="cpu")
    assert np.isfinite(model([1, 2, 3], last_only=True).numpy()).all()
    real = GGUFFile(smollm2_gguf)
    assert {i.file_dtype for i in real.infos.values()} == {"F32", "Q4_1", "Q8_0"} and len(real) == 272
    spans = sorted((i.offset, i.nbytes) for i in real.infos.values())
    assert spans[0][0] == real.data_start
    assert all(0 <= nxt - (lo + n) < real.alignment for (lo, n), (nxt, _) in zip(spans, spans[1:] + [(real.size, 0)]))
    real.close()
    rewritten = tmp_path / "rewritten.gguf"
    src = GGUFFile(_write(tmp_path / "src.gguf", qwen2_blob))
    write_gguf(rewritten, {n: (i.dtype.name, i.shape, src.raw(n)) for n, i in src.infos.items()},
               src.metadata, src.metadata_types, alignment=64)
    assert GGUFFile(rewritten).alignment == 64
