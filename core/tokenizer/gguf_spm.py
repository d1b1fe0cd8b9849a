"""GGUF SentencePiece vocabularies (`tokenizer.ggml.model` = "llama": Llama 2,
TinyLlama, Mistral, Gemma) -> the tokenizer.json components that run them.

llama.cpp's SPM tokenizer merges the adjacent pair whose joined string is the
best-scored token, falls back to <0xNN> byte tokens, and puts a space before
each stretch of text (at the start and after every special token) when
add_space_prefix is on. The same thing as a tokenizer.json: a byte-fallback
BPE whose merges are every split of every token into two tokens, ranked by
the joined token's score (how transformers reads these files, too), with the
normalizer Prepend("▁") + Replace(" ", "▁") of Llama 2's own tokenizer.json.

Listing those merges costs seconds for a 262,144-token vocabulary (Gemma 3), and
the `tokenizers` library half a second more to read them; so they stay unlisted
(DerivedMerges) and the pure-Python BPE asks PairRanks for a pair's rank, computed
from the joined token, only when it meets the pair.
"""
from ..errors import FormatError

SPACE = "\u2581"


def _scores(meta, tokens, source):
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        return [0.0] * len(tokens)  # llama.cpp's default when a file has none
    if (not isinstance(scores, list) or len(scores) != len(tokens)
            or not (set(map(type, scores)) <= {float, int}  # checked at C speed; bool is not int here
                    or all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores))):
        raise FormatError(f"{source}: tokenizer.ggml.scores = {scores!r:.80}: must be an array of "
                          f"{len(tokens)} numbers (one per token)")
    return list(map(float, scores))


def derive_merges(tokens, vocab, scores):
    """Every way to cut a token into two tokens, best-scored joined token first; ties keep
    longer left parts first, then vocabulary order -- the order transformers derives."""
    found = []
    seen = set()
    for token in tokens:
        if token in seen:
            continue
        seen.add(token)
        score = scores[vocab[token]]
        cuts = [(token[:i], token[i:]) for i in range(1, len(token))
                if token[:i] in vocab and token[i:] in vocab]
        cuts.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found.extend((score, left, right) for left, right in cuts)
    found.sort(key=lambda m: (-m[0], -len(m[1]), -len(m[2])))  # stable: equal keys keep their order
    return [[left, right] for _score, left, right in found]


class DerivedMerges:
    """The merges derive_merges would list, not listed until asked: pairs() lists them
    (the `tokenizers` library needs the list), ranks() ranks a pair when it is met."""

    def __init__(self, tokens, vocab, scores):
        self.tokens, self.vocab, self.scores = tokens, vocab, scores

    def pairs(self):
        return derive_merges(self.tokens, self.vocab, self.scores)

    def ranks(self):
        return PairRanks(self.tokens, self.vocab, self.scores)


class PairRanks:
    """(left id, right id) -> (rank, merged id) or None, like BPE.merges, for the merges of
    derive_merges: a pair merges when the joined string is a token, and it ranks by
    derive_merges' sort key (-score, -len(left), -len(right), then the joined token's id, the
    order its stable sort leaves equal keys in) packed into one int. The ids met are first ids
    of their strings (vocab's), so tokens[id] is the string."""

    def __init__(self, tokens, vocab, scores):
        self.tokens, self.vocab, self.scores = tokens, vocab, scores
        self.span = max(map(len, vocab), default=1) + 1  # > any length: packs the lengths
        self.count = len(tokens)
        self._score_rank = None

    def _rank_of_score(self):
        """score -> its place among the distinct scores, best first (made on first use)."""
        if self._score_rank is None:
            self._score_rank = {s: r for r, s in enumerate(sorted(set(self.scores), reverse=True))}
        return self._score_rank

    def get(self, pair):
        tokens = self.tokens
        left, right = tokens[pair[0]], tokens[pair[1]]
        merged = self.vocab.get(left + right)
        if merged is None:
            return None
        span = self.span
        rank = self._rank_of_score()[self.scores[merged]]
        rank = ((rank * span + span - len(left)) * span + span - len(right)) * self.count + merged
        return rank, merged


def components(meta, tokens, vocab, source):
    """(model, normalizer, pre_tokenizer, decoder) of a tokenizer.json for an SPM vocabulary."""
    architecture = meta.get("general.architecture")
    scores = _scores(meta, tokens, source)
    if isinstance(architecture, str) and architecture.startswith("gemma"):
        # Gemma files store runs of spaces as real spaces and rank merges by file order,
        # not by score (what transformers' Gemma reader does too).
        if any(t and not t.strip(" ") for t in tokens):
            tokens = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
            vocab = {}
            for i, t in enumerate(tokens):
                vocab.setdefault(t, i)
        scores = list(map(float, range(0, -len(tokens), -1)))
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        merges = DerivedMerges(tokens, vocab, scores)
    elif not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise FormatError(f"{source}: tokenizer.ggml.merges = {merges!r:.80}: must be an array of strings")
    add_space = meta.get("tokenizer.ggml.add_space_prefix", True)
    if not isinstance(add_space, bool):
        raise FormatError(f"{source}: tokenizer.ggml.add_space_prefix = {add_space!r:.40}: must be true or false")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if type(unk_id) is int and 0 <= unk_id < len(tokens) else None
    model = {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": vocab, "merges": merges}
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    normalizer = {"type": "Sequence", "normalizers": (
        [{"type": "Prepend", "prepend": SPACE}] if add_space else []) + [replace]}
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if add_space:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return model, normalizer, None, {"type": "Sequence", "decoders": decoders}
