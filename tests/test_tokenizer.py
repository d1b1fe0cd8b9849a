"""tallow.tokenizer: the pure-Python BPE against the `tokenizers` library,
GGUF vocabularies, streaming decode and chat templates (against transformers).

Real data, from the fixtures of tests/conftest.py: Whisper tiny.en's tokenizer.json
and SmolLM2-135M-Instruct's GGUF in the tallow cache ($TALLOW_HOME, where `tallow fetch`
puts them; the GGUF may also be named by $TALLOW_SMOLLM2_GGUF). Tests needing them
skip, saying so, when they are absent.
"""
import copy
import json
import os
import random
import sys
import unicodedata

import numpy as np
import pytest

import tallow
from tallow.errors import Error, FormatError, UnsupportedError
from tallow.tokenizer import ChatTemplateError, Tokenizer
from tallow.tokenizer.unicode_classes import compile_pattern, translate

import gguf_files

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_PATH = os.path.join(HERE, "data", "tokenizer_corpus.txt")


def corpus_text():
    with open(CORPUS_PATH, encoding="utf-8", newline="") as f:
        return f.read()


CORPUS = corpus_text()
# Split on "\n" only: str.splitlines would also split on \x1c..\x1e, \x85, \u2028.
LINES = CORPUS.split("\n")
MULTIBYTE_LINES = [line for line in LINES if any(ord(c) > 0x7FF for c in line)]


# ---- the real tokenizers ---------------------------------------------------
@pytest.fixture(scope="session")
def whisper_json(whisper_tiny_dir):
    return str(whisper_tiny_dir / "tokenizer.json")


@pytest.fixture(scope="session")
def whisper_pair(whisper_json):
    pytest.importorskip("tokenizers")
    return Tokenizer.from_file(whisper_json, backend="python"), Tokenizer.from_file(whisper_json, backend="tokenizers")


@pytest.fixture(scope="session")
def smollm2_meta(smollm2_gguf):
    import tallow.io
    with tallow.io.open(smollm2_gguf) as f:
        return f.metadata


@pytest.fixture(scope="session")
def gguf_reader(smollm2_gguf):
    """The `gguf` package's reader: the reference for metadata (slow: ~7 s)."""
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(smollm2_gguf)


@pytest.fixture(scope="session")
def transformers_smollm2(smollm2_gguf):
    """transformers' tokenizer built from the GGUF (slow: ~15 s)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf))


@pytest.fixture(scope="session")
def smollm2_pair(smollm2_gguf):
    pytest.importorskip("tokenizers")
    return Tokenizer.from_gguf(smollm2_gguf, backend="python"), Tokenizer.from_gguf(smollm2_gguf, backend="tokenizers")


def assert_same_ids(ours, reference, texts, label):
    for add_special in (True, False):
        for text in texts:
            got = ours.encode(text, add_special_tokens=add_special)
            want = reference.encode(text, add_special_tokens=add_special)
            assert got == want, f"{label}: ids differ for {text!r} (add_special_tokens={add_special})"


# ---- the corpus -------------------------------------------------------------
def test_corpus_is_varied():
    assert 300 <= len(LINES) and len(CORPUS.encode("utf-8")) < 200_000
    cats = {unicodedata.category(c) for c in CORPUS}
    assert {"Lo", "Nd", "Zs", "Cc", "Mn", "So", "Cf"} <= cats  # CJK, digits, spaces, tabs, combining, emoji, ZWJ
    assert "\t" in CORPUS and "\u200d" in CORPUS and "  " in CORPUS
    for script_char in "中ひ한éжعשक":
        assert script_char in CORPUS


# ---- regex translation ------------------------------------------------------
def _runs(regex, text):
    out, prev = [], 0
    for m in regex.finditer(text):
        if m.start() > prev:
            out.append(text[prev:m.start()])
        out.append(m.group())
        prev = m.end()
    if prev < len(text):
        out.append(text[prev:])
    return out


@pytest.mark.parametrize("cls", [r"\s", r"\p{L}", r"\p{N}"])
def test_unicode_classes_match_oniguruma_on_every_code_point(cls):
    """Runs of the class over all of Unicode, as `re` sees them vs as the
    `tokenizers` library (Oniguruma) sees them. They may differ only on code
    points this Python's Unicode database does not assign yet."""
    tokenizers = pytest.importorskip("tokenizers")
    text = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(cls), "removed")
    kept_by_onig = {c for piece, _ in split.pre_tokenize_str(text) for c in piece}
    kept_by_ours = set(compile_pattern(cls).sub("", text))
    differ = kept_by_onig ^ kept_by_ours
    assert all(unicodedata.category(c) == "Cn" for c in differ), sorted(hex(ord(c)) for c in differ)[:20]
    if unicodedata.unidata_version >= "16":
        assert not differ


def test_translate_keeps_plain_syntax_and_refuses_negated_class_members():
    assert translate(r"'s|\d+|[a-z]+(?!\S)").startswith(r"'s|\d+|[a-z]+(?![^")
    assert translate(r"[]a]") == r"[\]a]"
    with pytest.raises(FormatError, match="negated property"):
        translate(r"[\P{L}x]")
    with pytest.raises(FormatError, match="does not know"):
        translate(r"\p{Klingon}")


def test_gpt2_split_equals_the_library_pre_tokenizer_on_the_corpus():
    tokenizers = pytest.importorskip("tokenizers")
    from tallow.tokenizer.byte_level import GPT2_PATTERN
    ref = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bl = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ours = compile_pattern(GPT2_PATTERN)
    from tallow.tokenizer.byte_level import encode_bytes
    for line in LINES:
        want = [p for p, _ in ref.pre_tokenize_str(line)]
        got = [encode_bytes(p) for p in _runs(ours, line)]
        assert got == want, line
        assert [p for p, _ in bl.pre_tokenize_str(line)] == ([encode_bytes(line)] if line else [])


# ---- Whisper tokenizer.json -----------------------------------------------
def test_whisper_python_equals_library_on_every_line(whisper_pair):
    ours, lib = whisper_pair
    assert ours.backend == "python" and lib.backend == "tokenizers"
    assert_same_ids(ours, lib, LINES, "whisper")


def test_whisper_python_equals_library_on_multi_line_text(whisper_pair):
    ours, lib = whisper_pair
    chunks = ["\n".join(LINES[i:i + 7]) for i in range(0, len(LINES), 7)]
    assert_same_ids(ours, lib, chunks + [CORPUS], "whisper")


def test_whisper_known_ids_and_specials(whisper_pair):
    ours, lib = whisper_pair
    # tiny.en's prompt: <|startoftranscript|> (50257), <|notimestamps|> (50362), text, <|endoftext|>.
    ids = ours.encode(" And so my fellow Americans")
    assert ids[:2] == [50257, 50362] and ids[-1] == 50256
    assert ours.encode("<|startoftranscript|><|notimestamps|>", add_special_tokens=False) == [50257, 50362]
    assert ours.token_to_id("<|endoftext|>") == 50256 == ours.eos_id
    assert ours.id_to_token(50362) == "<|notimestamps|>"
    assert ours.special_tokens["<|en|>"] == 50258 and len(ours.special_tokens) == 107
    assert ours.vocab_size == lib.vocab_size == lib._impl.tok.get_vocab_size(with_added_tokens=True) == 50363
    for tid in (0, 198, 50256, 50300, 50362):
        assert ours.id_to_token(tid) == lib.id_to_token(tid)


def test_whisper_decode_round_trips_and_equals_library(whisper_pair):
    ours, lib = whisper_pair
    for line in LINES:
        assert ours.decode(ours.encode(line, add_special_tokens=False)) == line
        ids = ours.encode(line)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == lib.decode(ids, skip_special_tokens=skip)


def test_decode_of_broken_utf8_equals_library(whisper_pair):
    """Random runs of single-byte tokens make invalid UTF-8: the U+FFFD
    replacements must be placed exactly as Rust's from_utf8_lossy places them."""
    ours, lib = whisper_pair
    byte_ids = list(range(256))  # GPT-2's first 256 ids are its single-byte tokens
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.choice(byte_ids + [50256, 15496]) for _ in range(rng.randint(1, 12))]
        assert ours.decode(ids) == lib.decode(ids), ids


def test_bad_ids_and_inputs_raise_clear_errors(whisper_pair):
    for tok in whisper_pair:
        with pytest.raises(FormatError, match="outside the vocabulary"):
            tok.decode([15496, 10 ** 6])
        with pytest.raises(FormatError, match="expects a str"):
            tok.encode(b"bytes")
    with pytest.raises(UnsupportedError, match="unknown tokenizer backend"):
        Tokenizer.from_dict(json.loads('{"model": {"type": "BPE", "vocab": {}, "merges": []}}'), backend="rust")


def test_negative_and_non_integer_ids_are_refused(whisper_pair):
    for tok in whisper_pair:
        with pytest.raises(tallow.IndexRangeError, match="decode: token id -1 is negative"):
            tok.decode([15496, -1])
        with pytest.raises(tallow.IndexRangeError, match="id_to_token: token id -5 is negative"):
            tok.id_to_token(-5)
        with pytest.raises(tallow.DTypeError, match="token ids must be integers"):
            tok.decode([15496, 1.5])
        assert tok.decode(np.array([15496, 995])) == tok.decode([15496, 995])  # numpy ints are ids


def _transformers_whisper(whisper_json):
    """transformers' WhisperTokenizerFast over the same tokenizer.json, its special tokens
    registered as a checkpoint's tokenizer_config.json would (so timestamps follow <|notimestamps|>)."""
    transformers = pytest.importorskip("transformers")
    with open(whisper_json, encoding="utf-8") as f:
        added = [d["content"] for d in json.load(f)["added_tokens"] if d["special"] and d["content"] != "<|endoftext|>"]
    return transformers.WhisperTokenizerFast(tokenizer_file=whisper_json, additional_special_tokens=added,
                                             bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                             unk_token="<|endoftext|>")


def test_whisper_timestamp_ids_decode_like_transformers(whisper_pair, whisper_json):
    """<|0.00|>.. are not in tokenizer.json: the library drops them, transformers' WhisperTokenizer
    writes them with decode_with_timestamps=True; tallow does both instead of refusing them."""
    import tokenizers
    ref = _transformers_whisper(whisper_json)
    lib = tokenizers.Tokenizer.from_file(whisper_json)
    begin = ref.convert_tokens_to_ids("<|notimestamps|>") + 1
    text = [ref.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|notimestamps|>")]
    ids = text + [begin, 1770, 13, begin + 51, begin + 56, 2159, begin + 137, begin + 1500,
                  ref.convert_tokens_to_ids("<|endoftext|>")]
    for tok in whisper_pair:
        for skip in (False, True):
            assert tok.decode(ids, skip) == lib.decode(ids, skip_special_tokens=skip) == \
                ref.decode(ids, skip_special_tokens=skip)
            got = tok.decode(ids, skip, decode_with_timestamps=True)
            assert got == ref.decode(ids, skip_special_tokens=skip, decode_with_timestamps=True)
        assert "<|1.02|>" in got and got.endswith("<|30.00|>")
        with pytest.raises(FormatError, match="outside the vocabulary"):
            tok.decode([begin + 1501])  # past <|30.00|> an id is not a timestamp


# ---- SmolLM2 GGUF -----------------------------------------------------------
def _reference_from_gguf(reader):
    """The reference: the `tokenizers` library's own BPE and pre-tokenizers,
    with vocabulary read by the `gguf` package -- none of tallow's code."""
    tokenizers = pytest.importorskip("tokenizers")
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field("tokenizer.ggml.merges")]
    assert field("tokenizer.ggml.pre") == "smollm" and field("tokenizer.ggml.model") == "gpt2"
    tok = tokenizers.Tokenizer(tokenizers.models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # llama.cpp's "smollm" pre-tokenizer = StarCoder's: single digits, then GPT-2's byte-level split.
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Digits(individual_digits=True),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def test_smollm2_python_equals_library_reference_on_every_line(gguf_reader, smollm2_pair):
    ref = _reference_from_gguf(gguf_reader)
    ours, lib = smollm2_pair
    assert ours.backend == "python"
    for text in LINES + [CORPUS]:
        want = ref.encode(text).ids
        assert ours.encode(text) == want, text
        assert lib.encode(text) == want, text
        assert ours.decode(want) == ref.decode(want, skip_special_tokens=False) == lib.decode(want)


def test_smollm2_special_tokens_from_gguf(smollm2_pair, smollm2_meta, smollm2_gguf):
    ours, lib = smollm2_pair
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.unk_id) == (1, 2, 2, 0)
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert ours.encode("<|im_start|>user\nHi<|im_end|>")[0] == 1  # add_bos_token is false: no extra bos
    assert ours.encode("a<|im_end|>b", add_special_tokens=False)[1] == 2
    assert ours.vocab_size == lib.vocab_size == len(smollm2_meta["tokenizer.ggml.tokens"])
    assert len(ours.special_tokens) == 17
    # The metadata dict and an opened file give the same tokenizer as the path.
    assert Tokenizer.from_gguf(smollm2_meta, backend="python").encode(CORPUS) == ours.encode(CORPUS)
    import tallow.io
    with tallow.io.open(smollm2_gguf) as f:
        assert Tokenizer.from_gguf(f, backend="python").encode(CORPUS) == ours.encode(CORPUS)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2", "starcoder"])
def test_gguf_pre_tokenizers_python_equals_library(smollm2_meta, pre):
    """Each GGUF pre-tokenizer name becomes tokenizer.json components (Split
    regexes for llama-bpe / qwen2): the library runs them with Oniguruma, we
    with the translated `re` classes."""
    pytest.importorskip("tokenizers")
    meta = dict(smollm2_meta, **{"tokenizer.ggml.pre": pre})
    ours, lib = Tokenizer.from_gguf(meta, backend="python"), Tokenizer.from_gguf(meta, backend="tokenizers")
    assert_same_ids(ours, lib, LINES + [CORPUS], pre)


def test_llama_bpe_adds_bos_and_ignores_merges(smollm2_meta):
    meta = dict(smollm2_meta, **{"tokenizer.ggml.pre": "llama-bpe"})
    del meta["tokenizer.ggml.add_bos_token"]
    tok = Tokenizer.from_gguf(meta, backend="python")
    assert tok.encode("Hello")[0] == tok.bos_id == 1
    assert tok._impl.model.ignore_merges


def test_smollm2_transformers_tokenizer_agrees(transformers_smollm2, smollm2_meta):
    """transformers builds its GGUF tokenizer with GPT-2's plain byte-level
    split (it ignores tokenizer.ggml.pre); ours with pre forced to "gpt2"
    must give its ids exactly."""
    ref = transformers_smollm2
    ours = Tokenizer.from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.pre": "gpt2"}), backend="python")
    for text in LINES:
        assert ours.encode(text) == ref.encode(text), text


# ---- streaming --------------------------------------------------------------
def _check_stream(tok, ids):
    dec = tok.stream_decoder()
    emitted = ""
    held_back = False
    for k, tid in enumerate(ids, 1):
        piece = dec.step(tid)
        held_back |= piece == ""
        emitted += piece
        full = tok.decode(ids[:k])
        assert full.startswith(emitted)
        if "\ufffd" not in full:
            assert "\ufffd" not in emitted  # never a broken character
        assert emitted + copy.copy(dec).flush() == full
    assert emitted + dec.flush() == tok.decode(ids)
    return held_back


def test_stream_decoding_equals_full_decoding_at_every_prefix(whisper_pair, smollm2_pair):
    assert len(MULTIBYTE_LINES) >= 30
    for tok in (*whisper_pair, *smollm2_pair):
        held = [_check_stream(tok, tok.encode(line)) for line in MULTIBYTE_LINES]
        assert sum(held) >= 10, "the corpus should split characters across tokens"


def test_stream_decoder_skips_specials_and_resets(whisper_pair):
    ours, _ = whisper_pair
    dec = ours.stream_decoder(skip_special_tokens=True)
    out = "".join(dec.step(t) for t in ours.encode(" 中文 👩‍👩‍👧")) + dec.flush()
    assert out == " 中文 👩‍👩‍👧"
    lone = ours.token_to_id("ä")  # the byte 0xE4 alone: the start of a 3-byte character
    assert dec.step(lone) == "" and dec.flush() == "\ufffd" and dec.flush() == ""


# ---- chat templates ---------------------------------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "Und auf Deutsch? 🤔"}],
    [{"role": "user", "content": "  spaces\tand\nnewlines  "}],
]


def test_chat_template_equals_transformers(transformers_smollm2, smollm2_pair):
    pytest.importorskip("jinja2")
    ref = transformers_smollm2
    ours, lib = smollm2_pair
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want
            assert lib.apply_chat_template(messages, add_generation_prompt=gen) == want
    prompt = ours.apply_chat_template(CONVERSATIONS[1])
    assert ours.encode(prompt).count(1) == 5  # each "<|im_start|>" is one id


def test_chat_template_helpers_and_errors(whisper_pair):
    pytest.importorskip("jinja2")
    ours, _ = whisper_pair
    strict = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}"
              "{% for m in messages %}{{ m['content'] | tojson }}{% generation %}!{% endgeneration %}\n{% endfor %}"
              "{{ eos_token }}")
    assert ours.apply_chat_template([{"role": "user", "content": "é"}], template=strict) == '"é"!<|endoftext|>'  # trim_blocks eats the newline
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        ours.apply_chat_template([{"role": "assistant", "content": "x"}], template=strict)
    with pytest.raises(FormatError, match="no chat template"):
        ours.apply_chat_template([{"role": "user", "content": "x"}])
    sneaky = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ours.apply_chat_template([], template=sneaky)
    assert issubclass(ChatTemplateError, Error)


def test_tokenizer_config_supplies_template_and_special_names(tmp_path, whisper_json):
    pytest.importorskip("jinja2")
    with open(whisper_json, encoding="utf-8") as f:
        spec = f.read()
    (tmp_path / "tokenizer.json").write_text(spec, encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|startoftranscript|>"}, "pad_token": "<|endoftext|>",
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]}))
    tok = Tokenizer.from_file(tmp_path, backend="python")
    assert tok.bos_id == 50257 and tok.pad_id == 50256 and tok.eos_id == 50256
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|startoftranscript|>x"


# ---- other tokenizer.json features, against the library ---------------------
@pytest.fixture(scope="module")
def trained_spec():
    """A small BPE trained by the library on the corpus's ASCII lines, so
    CJK/emoji/Cyrillic are out of vocabulary."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("▁"),
                                                      tokenizers.normalizers.Replace(" ", "▁")])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator([line for line in LINES if line.isascii()], trainer)
    return json.loads(tok.to_str())


def _llama2_style(spec, byte_fallback, fuse_unk, ignore_merges):
    spec = copy.deepcopy(spec)
    model = spec["model"]
    model.update(byte_fallback=byte_fallback, fuse_unk=fuse_unk, ignore_merges=ignore_merges)
    if byte_fallback:
        start = max(model["vocab"].values()) + 1
        model["vocab"].update({"<0x%02X>" % b: start + b for b in range(256)})
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    spec["pre_tokenizer"] = None
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return spec


@pytest.mark.parametrize("byte_fallback,fuse_unk,ignore_merges",
                         [(True, False, False), (False, True, False), (False, False, True)])
def test_byte_fallback_unk_normalizers_and_decoders_equal_library(trained_spec, byte_fallback, fuse_unk, ignore_merges):
    spec = _llama2_style(trained_spec, byte_fallback, fuse_unk, ignore_merges)
    ours, lib = Tokenizer.from_dict(spec, backend="python"), Tokenizer.from_dict(spec, backend="tokenizers")
    assert_same_ids(ours, lib, LINES, "llama2-style")
    rng = random.Random(1)
    for line in LINES:
        ids = lib.encode(line)
        assert ours.decode(ids) == lib.decode(ids)
        if byte_fallback:
            assert ours.decode(ids, skip_special_tokens=True) == line
    byte_ids = list(range(spec["model"]["vocab"]["<0x00>"], spec["model"]["vocab"]["<0x00>"] + 256)) if byte_fallback else [5, 6]
    for _ in range(200):
        ids = [rng.choice(byte_ids + [7, 40, 1]) for _ in range(rng.randint(1, 10))]
        assert ours.decode(ids) == lib.decode(ids), ids


def test_added_token_flags_and_normalizers_equal_library(whisper_json):
    pytest.importorskip("tokenizers")
    with open(whisper_json, encoding="utf-8") as f:
        spec = json.load(f)
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                                              {"type": "Strip", "strip_left": True, "strip_right": True}]}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{P}+"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    spec["added_tokens"] += [
        {"id": 50363, "content": "<|im_start|>", "special": True, "normalized": False, "lstrip": True, "rstrip": True, "single_word": False},
        {"id": 50364, "content": "the", "special": False, "normalized": True, "lstrip": False, "rstrip": False, "single_word": True},
        {"id": 50365, "content": "ing", "special": False, "normalized": True, "lstrip": False, "rstrip": False, "single_word": False},
    ]
    ours, lib = Tokenizer.from_dict(spec, backend="python"), Tokenizer.from_dict(spec, backend="tokenizers")
    texts = LINES + ["The  <|im_start|>  the other thing, THE end", "bathe the theme", "  <|im_start|>x<|im_start|>  "]
    assert_same_ids(ours, lib, texts, "flags")
    for text in texts:
        ids = lib.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == lib.decode(ids, skip_special_tokens=skip)


def test_unsupported_and_corrupt_inputs(tmp_path, smollm2_meta):
    with pytest.raises(UnsupportedError, match="'bert' is not supported"):
        Tokenizer.from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(UnsupportedError, match="pre-tokenizer 'klingon'"):
        Tokenizer.from_gguf(dict(smollm2_meta, **{"tokenizer.ggml.pre": "klingon"}))
    with pytest.raises(FormatError, match="no tokenizer.ggml.model"):
        Tokenizer.from_gguf({"general.architecture": "llama"})
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML")
    with pytest.raises(FormatError, match="not a GGUF file"):
        Tokenizer.from_gguf(bad)
    with pytest.raises(FormatError, match="cannot open"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    with pytest.raises(FormatError, match="no such tokenizer file"):
        Tokenizer.from_file(tmp_path / "missing.json")
    spec = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}
    with pytest.raises(FormatError, match="missing from the vocabulary"):
        Tokenizer.from_dict(spec, backend="python")
    with pytest.raises(FormatError, match="pre_tokenizer type 'Whitespace'"):
        Tokenizer.from_dict({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}}, backend="python")


# ---- SentencePiece vocabularies: tokenizer.json (Metaspace, BPE, Unigram) ----
_SPECIALS = ["<unk>", "<s>", "</s>"]
_BYTES = ["<0x%02X>" % b for b in range(256)]


@pytest.fixture(scope="module")
def sentencepiece_specs():
    """SentencePiece-style BPE and Unigram tokenizers trained by the library on every
    other corpus line, so the other half meets characters they have never seen."""
    tokenizers = pytest.importorskip("tokenizers")
    train = LINES[::2]
    bpe = tokenizers.SentencePieceBPETokenizer()
    bpe.train_from_iterator(train, vocab_size=500, special_tokens=_SPECIALS, show_progress=False)
    unigram = tokenizers.SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(train, vocab_size=1200, special_tokens=_SPECIALS, unk_token="<unk>",
                                show_progress=False)
    return {"BPE": json.loads(bpe._tokenizer.to_str()), "Unigram": json.loads(unigram._tokenizer.to_str())}


def _sentencepiece_variant(spec, scheme, split, byte_fallback):
    spec = copy.deepcopy(spec)
    assert spec["pre_tokenizer"]["type"] == spec["decoder"]["type"] == "Metaspace"
    for key in ("pre_tokenizer", "decoder"):
        spec[key].update(prepend_scheme=scheme, split=split)
    if byte_fallback:  # Llama-style: <0xNN> tokens, no lossy normalizer, bytes decoded back
        model = spec["model"]
        model["byte_fallback"] = True
        if model["type"] == "Unigram":
            model["vocab"] += [[b, -30.0] for b in _BYTES]
        else:
            model["vocab"].update({b: len(model["vocab"]) + i for i, b in enumerate(_BYTES)})
        spec["normalizer"] = None
        spec["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, spec["decoder"]]}
    return spec


@pytest.mark.parametrize("kind", ["BPE", "Unigram"])
@pytest.mark.parametrize("scheme,split,byte_fallback", [("always", True, False), ("first", False, True),
                                                        ("never", True, True), ("always", False, True)])
def test_sentencepiece_tokenizer_json_python_equals_library(sentencepiece_specs, kind, scheme, split, byte_fallback):
    spec = _sentencepiece_variant(sentencepiece_specs[kind], scheme, split, byte_fallback)
    assert spec["model"]["type"] == kind
    ours, lib = Tokenizer.from_dict(spec, backend="python"), Tokenizer.from_dict(spec, backend="tokenizers")
    assert ours.vocab_size == lib.vocab_size
    texts = LINES + [CORPUS, "", " ", "  two", "<s>after a special</s> x", "\u2581lit\u2581\u2581eral"]
    assert_same_ids(ours, lib, texts, f"{kind} {scheme} split={split}")
    unknown = 0
    for text in texts:
        ids = lib.encode(text)
        unknown += ids.count(lib.unk_id if lib.unk_id is not None else 0)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == lib.decode(ids, skip_special_tokens=skip), text
        if byte_fallback and not text.startswith(" ") and "\u2581" not in text and "<s>" not in text:
            assert ours.decode(ids, skip_special_tokens=True) == text  # emoji, CJK, controls: back through bytes
    assert (unknown == 0) == byte_fallback  # the unseen half of the corpus does need the fallback
    rng = random.Random(2)
    for _ in range(200):
        ids = [rng.randrange(lib.vocab_size) for _ in range(rng.randint(1, 8))]
        assert ours.decode(ids) == lib.decode(ids), ids


def test_unigram_viterbi_and_errors():
    """The library's own doc example, then malformed Unigram descriptions."""
    pieces = [["<unk>", 0.0], ["a", 0.0], ["b", 0.0], ["c", 0.0], ["d", 0.0], ["cd", 1.0], ["ab", 2.0],
              ["abc", 5.0], ["abcd", 10.0]]
    spec = {"model": {"type": "Unigram", "unk_id": 0, "vocab": pieces}}
    for backend in ("python", "tokenizers"):
        tok = Tokenizer.from_dict(spec, backend=backend)
        assert tok.encode("abcdacdxx") == [8, 1, 5, 0]  # "abcd", "a", "cd", then "xx" fused into one <unk>
        assert tok.decode([8, 1, 5, 0]) == "abcd a cd <unk>"
    no_unk = {"model": {"type": "Unigram", "unk_id": None, "vocab": pieces[1:]}}
    for backend in ("python", "tokenizers"):
        with pytest.raises(FormatError, match="unk"):
            Tokenizer.from_dict(no_unk, backend=backend).encode("abx")
    for bad in ([["a"]], [["a", "high"]], {"a": 0}):
        with pytest.raises(FormatError, match=r"\[piece, score\] pairs"):
            Tokenizer.from_dict({"model": {"type": "Unigram", "vocab": bad}}, backend="python")
    with pytest.raises(FormatError, match="unk_id 9 is outside"):
        Tokenizer.from_dict({"model": {"type": "Unigram", "unk_id": 9, "vocab": pieces}}, backend="python")
    with pytest.raises(FormatError, match="prepend_scheme 'sometimes'"):
        Tokenizer.from_dict({"model": {"type": "Unigram", "unk_id": 0, "vocab": pieces},
                             "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "sometimes"}}, backend="python")
    with pytest.raises(UnsupportedError, match="model type 'WordPiece'"):
        Tokenizer.from_dict({"model": {"type": "WordPiece", "vocab": {}}}, backend="python")


# ---- SentencePiece vocabularies in GGUF (tokenizer.ggml.model = "llama") ------
@pytest.fixture(scope="module")
def llama_style_bpe():
    """A Llama-2-style vocabulary trained by the library on the corpus's ASCII lines:
    <unk> <s> </s>, the 256 byte tokens, then pieces; CJK and emoji need the bytes."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("\u2581"),
                                                      tokenizers.normalizers.Replace(" ", "\u2581")])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=700, special_tokens=_SPECIALS + _BYTES, show_progress=False)
    tok.train_from_iterator([line for line in LINES if line.isascii()], trainer)
    return json.loads(tok.to_str())


def _write_spm_gguf(path, spec, architecture, with_merges):
    """The vocabulary as llama.cpp's converter writes it: tokens, scores (-rank), types."""
    pytest.importorskip("gguf")
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert tokens[:3] == _SPECIALS and tokens[3:259] == _BYTES

    def metadata(w):
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * 259 + [-float(i) for i in range(259, len(tokens))])
        w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        if with_merges:
            w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
        if architecture.startswith("gemma"):
            w.add_add_space_prefix(False)
    return str(gguf_files.write(path, architecture, metadata))


def _transformers_gguf_reference(path):
    """transformers' own GGUF tokenizer reader (vocabulary, merges recovered from the scores,
    added tokens) -- the `tokenizers` library runs what it builds."""
    pytest.importorskip("transformers")
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    architecture, tokenizer_dict, _config = get_gguf_tokenizer(path)
    return convert_gguf_tokenizer(architecture, tokenizer_dict)[0]


@pytest.mark.parametrize("architecture,with_merges", [("llama", False), ("llama", True), ("gemma3", False)])
def test_gguf_sentencepiece_vocabulary_equals_transformers(tmp_path, llama_style_bpe, architecture, with_merges):
    tokenizers = pytest.importorskip("tokenizers")
    path = _write_spm_gguf(tmp_path / "spm.gguf", llama_style_bpe, architecture, with_merges)
    ref = _transformers_gguf_reference(path)
    ours, lib = Tokenizer.from_gguf(path, backend="python"), Tokenizer.from_gguf(path, backend="tokenizers")
    # (transformers' Gemma class appends a few tokens of its own; the file holds 700)
    assert (ours.bos_id, ours.eos_id, ours.unk_id, ours.vocab_size, lib.vocab_size) == (1, 2, 0, 700, 700)
    # transformers prepends "▁" with Metaspace(prepend_scheme="first"): the same as llama.cpp on text
    # that does not begin with a space and holds no special token.
    plain = [line for line in LINES if not line.startswith(" ")]
    for text in plain:
        want = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert lib.encode(text, add_special_tokens=False) == want, text
    if architecture == "llama":
        # llama.cpp writes " " + text for each stretch of text (at the start and after every special
        # token), which is Llama 2's own normalizer; set that on the reference for the rest.
        ref.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("\u2581"),
                                                          tokenizers.normalizers.Replace(" ", "\u2581")])
        ref.pre_tokenizer = None
    ref.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    texts = LINES + [CORPUS, "  two spaces", "<s>[INST] hi [/INST]</s> ok", "</s></s>x", ""]
    ref_ids = type("LibraryIds", (), {"encode": lambda _self, text, add_special_tokens=True:
                                      ref.encode(text, add_special_tokens=add_special_tokens).ids})()
    assert_same_ids(ours, ref_ids, texts, architecture)
    assert_same_ids(lib, ref_ids, texts, architecture)
    assert ours.encode("hi")[0] == 1  # llama.cpp adds bos to SentencePiece vocabularies by default
    byte_tokens = 0
    for text in texts:
        ids = ref.encode(text).ids
        byte_tokens += sum(3 <= i < 259 for i in ids)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
        if "<s>" not in text and "</s>" not in text:
            assert ours.decode(ids, skip_special_tokens=True) == text  # round trip, bytes included
    assert byte_tokens > 100
    # Streaming gives the same text, never a broken character. (Not _check_stream: ByteFallback decodes a
    # run of byte tokens all or nothing, so a prefix ending mid-character shows U+FFFD for the whole run.)
    held_back = 0
    for line in MULTIBYTE_LINES:
        ids = ours.encode(line)
        final, dec, emitted = ours.decode(ids, skip_special_tokens=True), ours.stream_decoder(True), ""
        for tid in ids:
            piece = dec.step(tid)
            held_back += piece == ""
            emitted += piece
            assert final.startswith(emitted), line  # final == line: no U+FFFD the line does not hold
        assert emitted + dec.flush() == final == line
    assert held_back >= 10  # characters split across byte tokens waited until complete


def test_gguf_sentencepiece_flags_and_errors(tmp_path, llama_style_bpe):
    path = _write_spm_gguf(tmp_path / "spm.gguf", llama_style_bpe, "llama", False)
    import tallow.io
    with tallow.io.open(path) as f:
        meta = dict(f.metadata)
    tok = Tokenizer.from_gguf(dict(meta, **{"tokenizer.ggml.add_bos_token": False,
                                            "tokenizer.ggml.add_space_prefix": False}), backend="python")
    assert tok.encode("hi there", add_special_tokens=True) == tok.encode("hi there", add_special_tokens=False)
    assert tok.id_to_token(tok.encode("hi there")[0]) in ("h", "hi")  # no "▁" in front
    assert tok.decode(tok.encode("hi there")) == "hi there"
    with pytest.raises(FormatError, match="tokenizer.ggml.scores .* 700 numbers"):
        Tokenizer.from_gguf(dict(meta, **{"tokenizer.ggml.scores": [0.0] * 3}))
    with pytest.raises(FormatError, match="add_space_prefix"):
        Tokenizer.from_gguf(dict(meta, **{"tokenizer.ggml.add_space_prefix": "yes"}))
    with pytest.raises(FormatError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(dict(meta, **{"tokenizer.ggml.merges": [1, 2]}))


# ---- inside Pyodide (CPython 3.14, no numpy, no tokenizers, no jinja2) -------
def _pyodide_fixtures():
    import importlib.util
    name = "tallow_tests_pyodide_fixture"  # the same module object test_pyodide.py loads
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "pyodide", "fixture.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


pyodide_runner = _pyodide_fixtures().pyodide_runner

_PYODIDE_CODE = r"""
import sys, time, unicodedata
from tallow.tokenizer import Tokenizer
from tallow.tokenizer.unicode_classes import compile_pattern
started = time.perf_counter()
lines = open('/tok/corpus/tokenizer_corpus.txt', encoding='utf-8', newline='').read().split('\n')
whisper = Tokenizer.from_file('/tok/whisper/tokenizer.json')
smol = Tokenizer.from_gguf('/tok/smollm2/' + GGUF_NAME)
load_s = time.perf_counter() - started
def streamed(tok, ids):
    d = tok.stream_decoder()
    return ''.join(d.step(i) for i in ids) + d.flush()
started = time.perf_counter()
out = {'python': sys.version, 'unicode': unicodedata.unidata_version, 'numpy': 'numpy' in sys.modules,
       'backends': [whisper.backend, smol.backend],
       'whisper': [whisper.encode(l) for l in lines], 'smol': [smol.encode(l) for l in lines],
       'decoded': [smol.decode(smol.encode(l, add_special_tokens=False)) for l in lines],
       'streamed': [streamed(whisper, whisper.encode(l)) for l in lines]}
tokenize_s = time.perf_counter() - started
try:
    smol.apply_chat_template([{'role': 'user', 'content': 'hi'}])
    out['chat'] = 'rendered'
except Exception as e:
    out['chat'] = type(e).__name__ + ': ' + str(e)
started = time.perf_counter()
text = ''.join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
def gaps(cls):
    spans, prev = [], 0
    for m in compile_pattern(cls + '+').finditer(text):
        if m.start() > prev:
            spans.append([prev, m.start()])
        prev = m.end()
    return spans + ([[prev, len(text)]] if prev < len(text) else [])
out['kept'] = {cls: gaps(cls) for cls in (r'\s', r'\p{L}', r'\p{N}')}
out['seconds'] = {'load': load_s, 'tokenize': tokenize_s, 'classes': time.perf_counter() - started}
out
"""


@pytest.mark.pyodide
def test_pure_python_tokenizer_inside_pyodide_equals_library(pyodide_runner, whisper_pair, smollm2_pair, smollm2_gguf,
                                                            whisper_json):
    tokenizers = pytest.importorskip("tokenizers")
    pyodide_runner.mount(os.path.dirname(CORPUS_PATH), "/tok/corpus")
    pyodide_runner.mount(os.path.dirname(whisper_json), "/tok/whisper")
    pyodide_runner.mount(os.path.dirname(smollm2_gguf), "/tok/smollm2")
    got = pyodide_runner.run(f"GGUF_NAME = {os.path.basename(smollm2_gguf)!r}\n" + _PYODIDE_CODE, timeout=300)
    assert got["python"].startswith("3.14") and got["numpy"] is False
    assert got["backends"] == ["python", "python"]  # `tokenizers` cannot load there: the fallback runs
    whisper_lib, smol_lib = whisper_pair[1], smollm2_pair[1]
    assert got["whisper"] == [whisper_lib.encode(line) for line in LINES]
    assert got["smol"] == [smol_lib.encode(line) for line in LINES]
    # Not always the line itself: SmolLM2's vocabulary has no token for the byte 0x1d, which both drop.
    assert got["decoded"] == [smol_lib.decode(smol_lib.encode(line, add_special_tokens=False)) for line in LINES]
    assert got["streamed"] == [whisper_lib.decode(whisper_lib.encode(line)) for line in LINES]
    assert got["chat"].startswith("UnsupportedError: apply_chat_template needs jinja2")
    # Pyodide's Python has Unicode 16, like Oniguruma in `tokenizers`: the classes must agree exactly.
    text = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    for cls, kept in got["kept"].items():
        split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(cls + "+"), "removed")
        onig = [list(offsets) for _, offsets in split.pre_tokenize_str(text)]
        if got["unicode"] >= "16":
            assert kept == onig, cls
    print("seconds inside Pyodide:", got["seconds"])


def test_fuzz_malformed_tokenizer_json_is_a_tallow_error():
    """One value of a small real tokenizer.json replaced by junk: both backends either work
    or raise a tallow Error (the pure-Python one used to raise TypeError/AttributeError)."""
    import tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="$A <|endoftext|>",
                                                                  special_tokens=[("<|endoftext|>", 0)])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox", "hello world"] * 10, trainer)
    spec = json.loads(tok.to_str())
    paths = []

    def walk(v, path):
        paths.append(path)
        children = v.items() if isinstance(v, dict) else enumerate(v[:3]) if isinstance(v, list) else ()
        for k, x in children:
            walk(x, path + [k])
    walk(spec, [])
    rng = random.Random(0)
    junk = [0, -1, "x", None, [], {}, [1], 1.5, True, 10 ** 12]
    for _ in range(150):
        bad = copy.deepcopy(spec)
        path = rng.choice(paths[1:])
        node = bad
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = rng.choice(junk)
        for backend in ("tokenizers", "python"):
            try:
                t = Tokenizer.from_dict(bad, backend=backend)
                t.decode(t.encode("the quick hello"))
            except Error:
                pass
