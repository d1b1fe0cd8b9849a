"""Pure-Python tokenizer: runs a tokenizer.json description without the
`tokenizers` library (Pyodide), giving the library's ids token for token."""
from ..errors import Error, FormatError, UnsupportedError
from . import decoders, gguf_spm, normalizers, post_processors, pre_tokenizers
from .added_tokens import AddedToken, AddedTokenMatcher
from .bpe import BPE
from .unigram import Unigram


def _component(source, spec, key, build):
    """A normalizer / pre-tokenizer / decoder / post-processor built from its description.
    The builders read well-formed descriptions; a malformed one (a number where an object
    belongs, a missing field) is reported here as the file's fault, naming the component."""
    value = spec.get(key)
    if value is not None and not isinstance(value, dict):
        raise FormatError(f"{source}: {key} = {value!r:.80}: must be an object or null")
    try:
        return build(value)
    except FormatError as e:
        if str(e).startswith(source):
            raise
        raise FormatError(f"{source}: {key}: {e}") from None
    except (Error, NotImplementedError):
        raise
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        raise FormatError(f"{source}: {key} is malformed ({type(e).__name__}: {e})") from None


_LONG_WORD = 4096  # characters: a word longer than this is checked against the limit first


class PythonTokenizer:
    name = "python"

    def __init__(self, spec, source="tokenizer.json"):
        model = spec.get("model") or {}
        kind = model.get("type", "BPE")
        if kind == "BPE":
            self.model = _bpe(model, source)
        elif kind == "Unigram":
            self.model = _unigram(model, source)
        else:
            raise UnsupportedError(f"{source}: model type {kind!r} is not supported by the pure-Python tokenizer "
                                   f"(BPE and Unigram are)")
        self.vocab = self.model.vocab
        self.added = [AddedToken.from_json(d) for d in spec.get("added_tokens") or []]
        for t in self.added:
            # A string the model already has keeps the model's id, as in `tokenizers`.
            t.id = self.vocab.get(t.content, t.id)
        self.id_to_added = {t.id: t for t in self.added}
        self.raw_matcher = AddedTokenMatcher([t for t in self.added if not t.normalized])
        self.normalized_matcher = AddedTokenMatcher([t for t in self.added if t.normalized])
        self.added_vocab = {t.content: t.id for t in self.added}
        self.special_ids = {t.id for t in self.added if t.special}
        self.id_to_vocab = ({i: t for i, (t, _score) in enumerate(self.model.pieces)} if kind == "Unigram"
                            else {i: t for t, i in self.vocab.items()})
        self.normalizer = _component(source, spec, "normalizer", normalizers.build)
        self.pre_tokenizer = _component(source, spec, "pre_tokenizer", pre_tokenizers.build)
        self.decoder = _component(source, spec, "decoder", decoders.build)
        self.post_processor = _component(source, spec, "post_processor",
                                         lambda d: post_processors.build(d, self.token_to_id))
        self.size = max([*self.id_to_vocab, *(t.id for t in self.added), -1]) + 1

    def token_to_id(self, token):
        tid = self.added_vocab.get(token)
        return tid if tid is not None else self.vocab.get(token)

    def id_to_token(self, tid):
        tok = self.id_to_added.get(tid)
        if tok is not None:
            return tok.content
        return self.id_to_vocab.get(tid)

    def _encode_piece(self, text, out, first, limit):
        """Text free of raw added tokens -> ids appended to `out`; `first`: it begins the text.
        Pieces are made and tokenized one at a time, so memory stays linear and small;
        False once `out` holds more than `limit` ids (the rest is not tokenized)."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        for i, (piece, tid) in enumerate(self.normalized_matcher.split(text)):
            if tid is not None:
                out.append(tid)
                continue
            if not piece:
                continue
            words = self.pre_tokenizer([piece], first and i == 0) if self.pre_tokenizer is not None else (piece,)
            for w in words:
                # A huge word (a 10 MB run of letters) need not be merged to know it passes the limit.
                if limit is not None and len(w) > _LONG_WORD and len(out) + self._min_tokens(w) > limit:
                    return False
                out.extend(self.model.tokenize(w))
                if limit is not None and len(out) > limit:
                    return False
        return True

    def _min_tokens(self, word):
        bound = getattr(self.model, "min_tokens", None)
        return bound(word) if bound is not None else 0

    def encode(self, text, add_special_tokens=True, limit=None):
        """Token ids of `text`; None as soon as they are known to number more than `limit`."""
        ids = []
        for i, (piece, tid) in enumerate(self.raw_matcher.split(text)):
            if tid is not None:
                ids.append(tid)
            elif piece and not self._encode_piece(piece, ids, i == 0, limit):
                return None
            if limit is not None and len(ids) > limit:
                return None
        if add_special_tokens and self.post_processor is not None:
            ids = self.post_processor(ids)
        return None if limit is not None and len(ids) > limit else ids

    def decode_tokens(self, ids, skip_special_tokens=False):
        tokens = []
        for tid in ids:
            if skip_special_tokens and tid in self.special_ids:
                continue
            tok = self.id_to_token(tid)
            if tok is None:
                raise FormatError(f"token id {tid} is outside the vocabulary (size {self.size})")
            tokens.append(tok)
        return tokens

    def decode(self, ids, skip_special_tokens=False):
        tokens = self.decode_tokens(ids, skip_special_tokens)
        if self.decoder is None:
            return " ".join(tokens)
        return "".join(self.decoder(tokens))


def _bpe(model, source):
    if model.get("dropout"):
        raise UnsupportedError(f"{source}: BPE dropout is not supported (it makes encoding random)")
    vocab = model.get("vocab")
    ids = vocab.values() if isinstance(vocab, dict) else ()
    if not isinstance(vocab, dict) or not (set(map(type, ids)) <= {int} and min(ids, default=0) >= 0):
        raise FormatError(f"{source}: model.vocab must be an object of token -> id (an integer >= 0)")
    merges = model.get("merges", [])
    pair_ranks = None
    if isinstance(merges, gguf_spm.DerivedMerges):
        merges, pair_ranks = [], merges.ranks()
    if not isinstance(merges, list) or not all(
            isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m))
            for m in merges):
        raise FormatError(f"{source}: model.merges must be a list of \"a b\" strings or [a, b] pairs")
    return BPE(
        dict(vocab), BPE.parse_merges(merges),
        unk_token=model.get("unk_token"), fuse_unk=model.get("fuse_unk", False),
        byte_fallback=model.get("byte_fallback", False), ignore_merges=model.get("ignore_merges", False),
        continuing_subword_prefix=model.get("continuing_subword_prefix") or "",
        end_of_word_suffix=model.get("end_of_word_suffix") or "", pair_ranks=pair_ranks,
    )


def _unigram(model, source):
    pieces = model.get("vocab")
    if not isinstance(pieces, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
            and isinstance(p[1], (int, float)) and not isinstance(p[1], bool) for p in pieces):
        raise FormatError(f"{source}: a Unigram model.vocab must be a list of [piece, score] pairs")
    unk_id = model.get("unk_id")
    if unk_id is not None and type(unk_id) is not int:
        raise FormatError(f"{source}: Unigram unk_id = {unk_id!r:.40}: must be an integer or null")
    return Unigram([(p, float(score)) for p, score in pieces], unk_id, bool(model.get("byte_fallback", False)))
