"""SentencePiece GGUF vocabularies without stored merges (Gemma 3's 262,144 tokens): the
pure-Python BPE ranks a pair when it meets it (gguf_spm.PairRanks) instead of listing ~280k
merges at load. The ids must be those of the listed merges run by the `tokenizers` library
(which test_tokenizer's test_gguf_sentencepiece_vocabulary_equals_transformers ties to
transformers' own GGUF reader)."""
import os
import sys

import numpy as np
import pytest

import gguf_files
from tallow.tokenizer import Tokenizer, gguf_spm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_synthetic_gguf as maker  # noqa: E402

sys.path.pop(0)

TEXTS = [
    "Hello world, this is a test.",
    "The quick brown fox jumps over the lazy dog 1234567890!",
    "  leading spaces and    runs   of   spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "unicode: naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji 🙂🚀👩‍👩‍👧 and byte fallback ∑∫√ ☃",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>",
    "<bos><eos>x<unk>y<pad>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabababababababababab",
    "",
    " ",
    "▁already▁has▁the▁marker",
    "MiXeD CaSe TeXt WiTh PuNcTuAtIoN...;;;:::!!!???",
]


@pytest.fixture(scope="module")
def gemma_vocab_gguf(tmp_path_factory):
    """The Gemma-3-270M-shaped vocabulary of scripts/make_synthetic_gguf.py, in a GGUF with
    no tensors: Gemma's specials, 256 byte pieces, then 261,882 scored pieces."""
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("spm") / "gemma3-vocab.gguf"
    rng = np.random.default_rng(0)
    return str(gguf_files.write(path, "gemma3", lambda w: maker._add_gemma_tokenizer(w, 262144, rng)))


def test_gemma_vocabulary_ids_equal_the_library_with_listed_merges(gemma_vocab_gguf):
    pytest.importorskip("tokenizers")
    ours = Tokenizer.from_gguf(gemma_vocab_gguf)
    lib = Tokenizer.from_gguf(gemma_vocab_gguf, backend="tokenizers")  # every merge listed, as before
    assert ours.backend == "python" and ours.vocab_size == lib.vocab_size == 262144
    texts = TEXTS + [" ".join(TEXTS) * 3]
    byte_pieces = 0
    for text in texts:
        for special in (True, False):
            want = lib.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == want, text
        byte_pieces += sum(6 <= i < 262 for i in want)
        assert ours.decode(want) == lib.decode(want), text
        assert ours.decode(want, skip_special_tokens=True) == lib.decode(want, skip_special_tokens=True), text
    assert byte_pieces > 50  # the unicode lines went through byte fallback
    assert ours.encode("Hello world")[0] == 2  # <bos>


def test_loading_lists_no_merges(gemma_vocab_gguf, monkeypatch):
    def refuse(*args):
        raise AssertionError("derive_merges called")
    monkeypatch.setattr(gguf_spm, "derive_merges", refuse)
    for backend in (None, "python"):
        tok = Tokenizer.from_gguf(gemma_vocab_gguf, backend=backend)
        assert len(tok.encode("a short text to encode")) > 1


def _ranked_pairs(tokens, scores):
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    ranks = gguf_spm.PairRanks(tokens, vocab, scores)
    found = []
    for a in vocab:
        for b in vocab:
            hit = ranks.get((vocab[a], vocab[b]))
            if hit is not None:
                assert hit[1] == vocab[a + b]
                found.append((hit[0], a, b))
    found.sort()
    assert len({r for r, _a, _b in found}) == len(found)  # one rank per pair
    return [[a, b] for _r, a, b in found], gguf_spm.derive_merges(tokens, vocab, scores)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_ranks_order_is_derive_merges_order(seed):
    """Scores with many ties (so the length and id tie-breaks decide), duplicated strings."""
    rng = np.random.default_rng(seed)
    new, _ = maker._random_merges(rng, maker.LETTERS[:12], 300, "")
    tokens = ["<unk>"] + maker.LETTERS[:12] + new + ["ab", "a"]  # the duplicates keep their first id
    scores = [float(s) for s in rng.integers(-4, 1, len(tokens))]
    got, want = _ranked_pairs(tokens, scores)
    assert len(want) > 300 and got == want


def test_pair_ranks_order_with_gemma_scores():
    rng = np.random.default_rng(3)
    new, _ = maker._random_merges(rng, maker.LETTERS[:20], 400, "")
    tokens = maker.LETTERS[:20] + new
    got, want = _ranked_pairs(tokens, [-float(i) for i in range(len(tokens))])
    assert len(want) > 400 and got == want
