"""The `tokenizers` backend builds a BPE tokenizer's model from Python objects
(tokenizers.models.BPE(vocab, merges)) instead of writing the whole spec as JSON for
Tokenizer.from_str: the result must be the library's own reading of the same spec (its
to_str() equal, the same ids), and the GGUF string arrays it starts from, now decoded in
bulk, must read as before, odd inputs included."""
import json

import pytest

from tallow import io
from tallow.errors import FormatError
from tallow.tokenizer import Tokenizer, hf_backend
from tallow.tokenizer.gguf_vocab import to_tokenizer_json

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["the theme", " the  the\tthe\n", "héllo wörld 123 <|endoftext|> the", "", "<|endoftext|>"]


def _meta(merges, pre="gpt2"):
    """A byte-level BPE vocabulary: the 256 byte symbols, three merged tokens, one control token."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())  # the library's 256 byte symbols
    tokens = alphabet + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3], "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": len(tokens) - 1, "tokenizer.ggml.bos_token_id": len(tokens) - 1}


def _library_reading(spec):
    """The library parsing the whole spec as JSON: the path the direct build replaces."""
    return tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


@pytest.mark.parametrize("pre", ["gpt2", "qwen2", "llama-bpe"])
@pytest.mark.parametrize("merges", [["Ġ t", "h e", "Ġt he"], []])
def test_direct_build_is_the_library_reading_of_the_spec(pre, merges):
    spec, _, _ = to_tokenizer_json(_meta(merges, pre))
    direct = hf_backend._built_directly(tokenizers, spec, "test")
    assert direct is not None  # the GGUF spec takes the direct path
    ref = _library_reading(spec)
    assert json.loads(direct.to_str()) == json.loads(ref.to_str())
    for text in TEXTS:
        assert direct.encode(text).ids == ref.encode(text).ids, text
    tok = Tokenizer.from_gguf(_meta(merges, pre), backend="tokenizers")
    assert [tok.encode(t) for t in TEXTS] == [ref.encode(t).ids for t in TEXTS]
    if merges:
        assert tok.encode(" the", add_special_tokens=False) == [256 + 2]


def test_smollm2_direct_equals_library_reading(smollm2_gguf):
    with io.open(smollm2_gguf) as f:
        meta = f.metadata
    spec, _, _ = to_tokenizer_json(meta)
    direct = hf_backend._built_directly(tokenizers, spec, "smollm2")
    assert json.loads(direct.to_str()) == json.loads(_library_reading(spec).to_str())


@pytest.mark.parametrize("bad,problem", [
    ("Ġt", "is not two tokens joined by one space"),  # no space
    ("Ġ t x", "is not two tokens joined by one space"),  # two spaces
    ("Ġ zz", "refused its BPE model"),  # a token the vocabulary lacks
    ("t h", "refused its BPE model"),  # both tokens known, "th" is not
])
def test_bad_merge_is_a_clear_error(bad, problem):
    meta = _meta(["Ġ t", bad, "h e"])
    with pytest.raises(FormatError, match=problem):
        Tokenizer.from_gguf(meta, backend="tokenizers")
    spec, _, _ = to_tokenizer_json(meta)
    with pytest.raises(Exception, match="Merges text file invalid|out of vocabulary"):  # the library refuses it too
        _library_reading(spec)


def test_tokenizer_json_with_pair_merges_still_loads():
    """tokenizer.json may list merges as [left, right] pairs: not the direct path, same tokenizer."""
    spec, _, _ = to_tokenizer_json(_meta(["Ġ t", "h e", "Ġt he"]))
    pairs = dict(spec, model=dict(spec["model"], merges=[m.split(" ") for m in spec["model"]["merges"]]))
    assert hf_backend._built_directly(tokenizers, pairs, "test") is None
    a, b = Tokenizer.from_dict(pairs, backend="tokenizers"), Tokenizer.from_dict(spec, backend="tokenizers")
    assert [a.encode(t) for t in TEXTS] == [b.encode(t) for t in TEXTS]


@pytest.mark.parametrize("strings", [
    [],
    [""],
    ["", "", ""],
    ["a", "", "héllo", "Ġthe", "日本語", "\n", "a b"],
    ["with\0nul", "x", "\0"],  # a NUL inside a string: the one-by-one way
])
def test_gguf_string_arrays_read_back(tmp_path, strings):
    path = tmp_path / "s.gguf"
    io.gguf.write_gguf(path, {}, {"a.strings": strings, "b.after": 7}, {"a.strings": (io.gguf.ARRAY, io.gguf.STRING)})
    with io.open(path) as f:
        assert f.metadata["a.strings"] == strings
        assert f.metadata["b.after"] == 7  # the cursor ends where the array does


def test_gguf_string_array_bad_utf8_is_named(tmp_path):
    path = tmp_path / "s.gguf"
    io.gguf.write_gguf(path, {}, {"a.strings": ["ok", "QQ", "fine"]})
    data = path.read_bytes()
    at = data.index(b"QQ")
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at + 2:])
    with pytest.raises(FormatError, match=rf"a.strings.*string at offset {at} is not UTF-8"):
        io.open(path)


def test_gguf_string_array_truncated_is_named(tmp_path):
    path = tmp_path / "s.gguf"
    io.gguf.write_gguf(path, {}, {"a.strings": ["one", "two", "three"]})
    data = path.read_bytes()
    path.write_bytes(data[:data.index(b"three") + 2])
    with pytest.raises(FormatError, match="truncated"):
        io.open(path)
