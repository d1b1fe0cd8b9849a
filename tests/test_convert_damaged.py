"""`tallow convert` on damaged CTranslate2 Whisper folders: every case is one FormatError
line naming the file and the field (exit status 2 from the CLI), never a KeyError,
IndexError, ValueError, TypeError or AttributeError from inside the converter.

The folders are copies of the real whisper-tiny.en CTranslate2 folder (the one `tallow
fetch` converts), with model.bin rewritten record by record in the layout
tallow.io.ctranslate2 documents, or config.json / tokenizer.json edited.
"""
import json
import shutil
import struct

import numpy as np
import pytest

import tallow
from tallow import hub
from tallow.cli import main as cli_main
from tallow.errors import FormatError
from tallow.io.ctranslate2 import DTYPES, load_ctranslate2
from tallow.models import whisper

CODES = {name: code for code, (name, _, _) in DTYPES.items()}


@pytest.fixture(scope="module")
def ct2_dir():
    return hub.fetch("whisper-tiny.en-ct2", progress=False)


@pytest.fixture(scope="module")
def records(ct2_dir):
    """The real model.bin as (spec, {name: (dtype, shape, bytes)}, aliases, revision)."""
    with load_ctranslate2(ct2_dir / "model.bin") as f:
        tensors = {n: (t.dtype, t.shape, bytes(t.data())) for n, t in f.tensors.items()}
        return f.spec, tensors, dict(f.aliases), f.revision


def _string(s):
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _write_model_bin(path, spec, tensors, aliases, revision):
    out = [struct.pack("<I", 6), _string(spec), struct.pack("<II", revision, len(tensors))]
    for name, (dtype, shape, data) in tensors.items():
        out += [_string(name), struct.pack(f"<B{len(shape)}I", len(shape), *shape),
                struct.pack("<BI", CODES[dtype], len(data)), data]
    out.append(struct.pack("<I", len(aliases)))
    out += [_string(a) + _string(t) for a, t in aliases.items()]
    path.write_bytes(b"".join(out))


def _copy(ct2_dir, tmp_path):
    src = tmp_path / "ct2"
    shutil.copytree(ct2_dir, src)
    return src


def _int8(records, name, scale_shape):
    """`name` stored as int8 with a `_scale` of `scale_shape` (the real per-row shape is (rows,))."""
    _, shape, data = records[1][name]
    w = np.frombuffer(data, np.float16).astype(np.float32).reshape(shape)
    scale = 127 / np.maximum(np.abs(w).max(axis=1), 1e-6)
    q = np.rint(w * scale[:, None]).astype(np.int8)
    scale = np.resize(scale.astype(np.float32), scale_shape)
    return {name: ("i8", shape, q.tobytes()), f"{name}_scale": ("f32", scale.shape, scale.tobytes())}


def _drop(name):
    return lambda records: {n: v for n, v in records[1].items() if n != name}


def _replace(**changed):
    return lambda records: {n: changed.get(n.replace("/", "__"), v) for n, v in records[1].items()}


def _with(fn):
    return lambda records: {**records[1], **fn(records)}


def _rank(name, shape):
    return lambda records: {n: (v[0], shape, v[2]) if n == name else v for n, v in records[1].items()}


F16_384 = ("f16", (384,), bytes(768))
MODEL_BIN_CASES = {
    "conv1 missing": (_drop("encoder/conv1/weight"), r"tensor 'encoder/conv1/weight' is missing"),
    "final norm missing": (_drop("encoder/layer_norm/gamma"), r"tensor 'encoder/layer_norm/gamma' is missing"),
    "layer norm beta missing": (_drop("decoder/layer_2/attention/layer_norm/beta"),
                                r"tensor 'decoder/layer_2/attention/layer_norm/beta' is missing"),
    "conv1 rank 2": (_rank("encoder/conv1/weight", (384, 240)),
                     r"tensor 'encoder/conv1/weight' has shape \[384, 240\]; expected 3"),
    "embedding rank 1": (_rank("decoder/embeddings/weight", (51864 * 384,)),
                         r"tensor 'decoder/embeddings/weight' has shape \[19915776\]; expected 2"),
    "norm rank 2": (_rank("encoder/layer_1/ffn/layer_norm/gamma", (1, 384)),
                    r"tensor 'encoder/layer_1/ffn/layer_norm/gamma' has shape \[1, 384\]; expected \[384\]"),
    "fc2 transposed": (_rank("decoder/layer_0/ffn/linear_1/weight", (1536, 384)),
                       r"tensor 'decoder/layer_0/ffn/linear_1/weight' has shape \[1536, 384\]; expected \[384, 1536\]"),
    "int8 scale of the wrong shape": (_with(lambda r: _int8(r, "encoder/layer_0/ffn/linear_0/weight", (5,))),
                                      r"tensor 'encoder/layer_0/ffn/linear_0/weight_scale' has shape \[5\]"),
    "int8 scale of rank 2": (_with(lambda r: _int8(r, "decoder/layer_1/attention/linear_1/weight", (768, 1))),
                             r"'decoder/layer_1/attention/linear_1/weight_scale' has shape \[768, 1\]"),
    "num_heads empty": (_with(lambda r: {"encoder/num_heads": ("i32", (0,), b"")}),
                        r"tensor 'encoder/num_heads' holds \[\] \(i32\); expected one integer head count"),
    "num_heads not dividing d_model": (_with(lambda r: {"decoder/num_heads": ("i32", (), struct.pack("<i", 7))}),
                                       r"tensor 'decoder/num_heads' holds \[7\]"),
    "int8 without a scale": (_with(lambda r: {"encoder/conv2/bias": ("i8", (384,), bytes(384))}),
                             r"tensor 'encoder/conv2/bias' is i8 without a encoder/conv2/bias_scale"),
}


@pytest.mark.parametrize("case", MODEL_BIN_CASES)
def test_damaged_model_bin_is_one_format_error(ct2_dir, records, tmp_path, case, capsys):
    mutate, message = MODEL_BIN_CASES[case]
    src = _copy(ct2_dir, tmp_path)
    _write_model_bin(src / "model.bin", records[0], mutate(records), *records[2:])
    with pytest.raises(FormatError, match=message) as caught:
        tallow.convert(src, tmp_path / "out")
    assert str(caught.value).startswith(f"{src / 'model.bin'}: ")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["ct2"]
    _assert_cli_line(src, tmp_path, capsys, f"{src / 'model.bin'}: ")


def _assert_cli_line(src, tmp_path, capsys, starts):
    capsys.readouterr()
    assert cli_main(["convert", "--quiet", str(src), str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"tallow convert: error: {starts}"), captured.err
    # Loading the damaged folder directly names the conversion it needs (tallow never reads it unconverted).
    for load in (tallow.load_model, whisper.load):
        with pytest.raises(FormatError, match=r"is a CTranslate2 \(faster-whisper\) model"):
            load(str(src))


def _tokenizer_edit(fn):
    def edit(tok):
        fn(tok)
        return tok
    return edit


def _set_added(value):
    return _tokenizer_edit(lambda t: t.__setitem__("added_tokens", value))


TOKENIZER_CASES = {
    "model a list": (_tokenizer_edit(lambda t: t.__setitem__("model", [t["model"]])), r"model = \[\{.*must be an object"),
    "vocab a list": (_tokenizer_edit(lambda t: t["model"].__setitem__("vocab", list(t["model"]["vocab"]))),
                     r"model\.vocab = \['!'.*must be an object of token -> id"),
    "added_tokens ints": (_set_added([50256, 50257]), r"added_tokens\[0\] = 50256: must be an object"),
    "added_tokens a dict": (_set_added({"<|endoftext|>": 50256}), r"added_tokens = \{'<\|endoftext\|>': 50256\}: "
                                                                  r"must be a list"),
    "added_tokens dicts without content": (_set_added([{"id": 50256}]), r"added_tokens\[0\] = \{'id': 50256\}"),
    "added token id a string": (_set_added([{"content": "<|endoftext|>", "id": "50256"}]),
                                r"added_tokens\[0\] = .*an integer \"id\""),
    "special token outside the vocabulary": (
        _tokenizer_edit(lambda t: t["added_tokens"][0].__setitem__("id", 60000)),
        r"added_tokens: '<\|endoftext\|>' has id 60000, outside the model's vocabulary .*51864 rows"),
    "special token missing": (_set_added([]), r"has no token '<\|startoftranscript\|>'"),
    "vocab id a float": (_tokenizer_edit(lambda t: (t.__setitem__("added_tokens", []),
                                                    t["model"]["vocab"].__setitem__("<|endoftext|>", 1.5))),
                         r"model\.vocab\['<\|endoftext\|>'\] = 1\.5: must be an integer id"),
}


@pytest.mark.parametrize("case", TOKENIZER_CASES)
def test_damaged_tokenizer_json_is_one_format_error(ct2_dir, tmp_path, case, capsys):
    edit, message = TOKENIZER_CASES[case]
    src = _copy(ct2_dir, tmp_path)
    tokenizer = json.loads((src / "tokenizer.json").read_text("utf-8"))
    (src / "tokenizer.json").write_text(json.dumps(edit(tokenizer)), encoding="utf-8")
    with pytest.raises(FormatError, match=message) as caught:
        tallow.convert(src, tmp_path / "out")
    assert str(caught.value).startswith(f"{src / 'tokenizer.json'}: ")
    _assert_cli_line(src, tmp_path, capsys, f"{src / 'tokenizer.json'}: ")


CONFIG_CASES = {
    "alignment_heads plain ints": ([1, 2, 3], r"'alignment_heads' must be a list of \[decoder layer, head\] pairs"),
    "alignment_heads a layer past the model": ([[4, 0]], r"within 4 layers and 6 heads, got \[\[4, 0\]\]"),
    "alignment_heads a head past the model": ([[0, 6]], r"got \[\[0, 6\]\]"),
    "alignment_heads a string": ("1,0", r"got 1,0"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_damaged_config_json_is_one_format_error(ct2_dir, tmp_path, case, capsys):
    value, message = CONFIG_CASES[case]
    src = _copy(ct2_dir, tmp_path)
    config = json.loads((src / "config.json").read_text("utf-8"))
    (src / "config.json").write_text(json.dumps(dict(config, alignment_heads=value)), encoding="utf-8")
    with pytest.raises(FormatError, match=message) as caught:
        tallow.convert(src, tmp_path / "out")
    assert str(caught.value).startswith(f"{src / 'config.json'}: ")
    _assert_cli_line(src, tmp_path, capsys, f"{src / 'config.json'}: ")


def test_rewritten_model_bin_still_converts(ct2_dir, records, tmp_path):
    """The rewriter above is faithful (the cases fail for their damage, not for the rewrite),
    and a well-formed int8 tensor with its per-row scale converts: the checks refuse only damage."""
    src = _copy(ct2_dir, tmp_path)
    _write_model_bin(src / "model.bin", *records)
    assert (src / "model.bin").read_bytes() == (ct2_dir / "model.bin").read_bytes()
    name = "encoder/layer_0/ffn/linear_0/weight"
    _write_model_bin(src / "model.bin", records[0], {**records[1], **_int8(records, name, (1536,))}, *records[2:])
    out = tallow.convert(src, tmp_path / "out")
    from safetensors.numpy import load_file
    fc1 = load_file(str(out / "model.safetensors"))["model.encoder.layers.0.fc1.weight"]
    _, shape, data = records[1][name]
    original = np.frombuffer(data, np.float16).reshape(shape).astype(np.float32)
    step = np.abs(original).max(axis=1, keepdims=True) / 127  # half a quantisation step, plus f16 rounding
    assert fc1.dtype == np.float16 and np.all(np.abs(fc1 - original) <= step / 2 + np.abs(original) * 1e-3 + 1e-6)
