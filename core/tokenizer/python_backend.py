"""Pure-Python tokenizer: runs a tokenizer.json description without the
`tokenizers` library (Pyodide), giving the library's ids token for token."""
from ..errors import Error, FormatError, UnsupportedError
from . import decoders, normalizers, post_processors, pre_tokenizers
from .added_tokens import AddedToken, AddedTokenMatcher
from .bpe import BPE


def _component(source, spec, key, build):
    """A normalizer / pre-tokenizer / decoder / post-processor built from its description.
    The builders read well-formed descriptions; a malformed one (a number where an object
    belongs, a missing field) is reported here as the file's fault, naming the component."""
    value = spec.get(key)
    if value is not None and not isinstance(value, dict):
        raise FormatError(f"{source}: {key} = {value!r:.80}: must be an object or null")
    try:
        return build(value)
    except (Error, NotImplementedError):
        raise
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        raise FormatError(f"{source}: {key} is malformed ({type(e).__name__}: {e})") from None


class PythonTokenizer:
    name = "python"

    def __init__(self, spec, source="tokenizer.json"):
        model = spec.get("model") or {}
        if model.get("type", "BPE") != "BPE":
            raise UnsupportedError(f"{source}: model type {model.get('type')!r} is not supported by the pure-Python tokenizer (only BPE)")
        if model.get("dropout"):
            raise UnsupportedError(f"{source}: BPE dropout is not supported (it makes encoding random)")
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not all(type(i) is int and i >= 0 for i in vocab.values()):
            raise FormatError(f"{source}: model.vocab must be an object of token -> id (an integer >= 0)")
        self.vocab = dict(vocab)
        merges = model.get("merges", [])
        if not isinstance(merges, list) or not all(
                isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m))
                for m in merges):
            raise FormatError(f"{source}: model.merges must be a list of \"a b\" strings or [a, b] pairs")
        self.bpe = BPE(
            self.vocab, BPE.parse_merges(merges),
            unk_token=model.get("unk_token"), fuse_unk=model.get("fuse_unk", False),
            byte_fallback=model.get("byte_fallback", False), ignore_merges=model.get("ignore_merges", False),
            continuing_subword_prefix=model.get("continuing_subword_prefix") or "",
            end_of_word_suffix=model.get("end_of_word_suffix") or "",
        )
        self.added = [AddedToken.from_json(d) for d in spec.get("added_tokens") or []]
        for t in self.added:
            # A string the model already has keeps the model's id, as in `tokenizers`.
            t.id = self.vocab.get(t.content, t.id)
        self.id_to_added = {t.id: t for t in self.added}
        self.raw_matcher = AddedTokenMatcher([t for t in self.added if not t.normalized])
        self.normalized_matcher = AddedTokenMatcher([t for t in self.added if t.normalized])
        self.added_vocab = {t.content: t.id for t in self.added}
        self.special_ids = {t.id for t in self.added if t.special}
        self.id_to_vocab = {i: t for t, i in self.vocab.items()}
        self.normalizer = _component(source, spec, "normalizer", normalizers.build)
        self.pre_tokenizer = _component(source, spec, "pre_tokenizer", pre_tokenizers.build)
        self.decoder = _component(source, spec, "decoder", decoders.build)
        self.post_processor = _component(source, spec, "post_processor",
                                         lambda d: post_processors.build(d, self.token_to_id))
        self.size = max([*self.vocab.values(), *(t.id for t in self.added), -1]) + 1

    def token_to_id(self, token):
        tid = self.added_vocab.get(token)
        return tid if tid is not None else self.vocab.get(token)

    def id_to_token(self, tid):
        tok = self.id_to_added.get(tid)
        if tok is not None:
            return tok.content
        return self.id_to_vocab.get(tid)

    def _encode_piece(self, text, out):
        """Text free of raw added tokens -> ids appended to `out`."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        for piece, tid in self.normalized_matcher.split(text):
            if tid is not None:
                out.append(tid)
                continue
            words = self.pre_tokenizer([piece]) if self.pre_tokenizer is not None else [piece]
            for w in words:
                out.extend(self.bpe.tokenize(w))

    def encode(self, text, add_special_tokens=True):
        ids = []
        for piece, tid in self.raw_matcher.split(text):
            if tid is not None:
                ids.append(tid)
            elif piece:
                self._encode_piece(piece, ids)
        if add_special_tokens and self.post_processor is not None:
            ids = self.post_processor(ids)
        return ids

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
