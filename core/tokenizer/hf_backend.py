"""The `tokenizers` library (Rust) behind tallow's tokenizer interface."""
import json
from itertools import repeat

from ..errors import FormatError, UnsupportedError
from .gguf_spm import DerivedMerges
from .regex_safety import check_spec

_FIRST_PREFIX = 1 << 16  # characters encoded whole, limit or not
_CUT_SLACK = 1024  # characters before a prefix's cut whose tokens are taken as settled


def _panic(e):
    """The library's Rust panics (e.g. Oniguruma's retry limit on a backtracking regex) reach
    Python as pyo3_runtime.PanicException, a BaseException: anything else is re-raised."""
    if type(e).__name__ != "PanicException":
        raise e
    return str(e).strip().splitlines()[-1:] or ["a Rust panic"]


def available():
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


class LibraryTokenizer:
    name = "tokenizers"

    def __init__(self, spec, source="tokenizer.json"):
        try:
            import tokenizers
        except ImportError:
            raise UnsupportedError("backend='tokenizers' needs the `tokenizers` package "
                                   "(pip install tokenizers)") from None
        check_spec(spec, source)  # Oniguruma would give up with a panic at encode time
        try:
            self.tok = _built_directly(tokenizers, spec, source)
            if self.tok is None:
                model = spec.get("model")
                if isinstance(model, dict) and isinstance(model.get("merges"), DerivedMerges):
                    spec = dict(spec, model=dict(model, merges=model["merges"].pairs()))  # the library needs the list
                # unescaped text parses faster (byte-level vocabularies are mostly non-ASCII): -20 ms
                self.tok = tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
        except FormatError:
            raise
        except Exception as e:  # the library raises plain Exception on bad JSON
            raise FormatError(f"{source}: the tokenizers library refused it: {e}") from None
        except BaseException as e:
            raise FormatError(f"{source}: the tokenizers library failed on it: {_panic(e)[0]}") from None
        self.source = source
        self.size = self.tok.get_vocab_size(with_added_tokens=True)
        _trim_heap()


    def token_to_id(self, token):
        return self.tok.token_to_id(token)

    def id_to_token(self, tid):
        return self.tok.id_to_token(tid)

    def encode(self, text, add_special_tokens=True, limit=None):
        """Token ids of `text`; None when they number more than `limit`. A long text is
        then encoded a growing prefix at a time, stopping once the prefix's tokens (all but
        those near the cut, which a longer text may tokenize differently) pass the limit:
        a 10 MB prompt cost the library 1.3 GB and 6 s to learn it did not fit."""
        if limit is not None:
            end = max(_FIRST_PREFIX, 8 * (limit + 1))
            while end < len(text):
                offsets = self._encode(text[:end], False).offsets
                settled = end - _CUT_SLACK
                if sum(1 for _, stop in offsets if stop <= settled) > limit:
                    return None
                end *= 2
        ids = self._encode(text, add_special_tokens).ids
        return None if limit is not None and len(ids) > limit else ids

    def _encode(self, text, add_special_tokens):
        try:
            return self.tok.encode(text, add_special_tokens=add_special_tokens)
        except Exception as e:  # e.g. a Unigram model meeting an unknown character with no unk_id
            raise FormatError(f"the tokenizers library cannot encode {text!r:.60}: {e}") from None
        except BaseException as e:
            raise FormatError(f"{self.source}: the tokenizers library failed encoding {text!r:.60}: "
                              f"{_panic(e)[0]}") from None

    def _check(self, ids):
        for tid in ids:
            if not 0 <= tid < self.size:
                raise FormatError(f"token id {tid} is outside the vocabulary (size {self.size})")

    def decode(self, ids, skip_special_tokens=False):
        ids = list(ids)
        self._check(ids)
        try:
            return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        except BaseException as e:
            raise FormatError(f"{self.source}: the tokenizers library failed decoding: {_panic(e)[0]}") from None


_BPE_KEYS = frozenset(("type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                       "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"))
_ADDED_KEYS = frozenset(("id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"))


def merge_pairs(merges, source):
    """A BPE model's merges as (left, right) pairs: "left right" strings split at their one
    space, as the library's tokenizer.json reader does; None when they are not all strings."""
    if isinstance(merges, DerivedMerges):
        return list(map(tuple, merges.pairs()))
    if not set(map(type, merges)) <= {str}:  # checked at C speed: 151k merges
        return None
    if not set(map(str.count, merges, repeat(" "))) <= {1}:  # each split below at C speed, none one by one
        rank = next(i for i, m in enumerate(merges) if m.count(" ") != 1)
        raise FormatError(f"{source}: merge {rank} = {merges[rank]!r:.60} is not two tokens joined by one space")
    parts = " ".join(merges).split(" ")
    return list(zip(parts[0::2], parts[1::2]))


def _built_directly(tokenizers, spec, source):
    """A BPE tokenizer with its vocabulary and merges handed to tokenizers.models.BPE as Python
    objects, the rest (normalizer, pre-tokenizer, post-processor, decoder) read from JSON: the
    same tokenizer as from_str of the whole spec (the tests compare their to_str()), without
    writing and re-parsing 151k merges as JSON (Qwen2.5's vocabulary: ~0.9 -> ~0.45 s).
    None when the spec is not of the shape this handles (then the caller parses it whole)."""
    model, added = spec.get("model"), spec.get("added_tokens") or []
    if not (isinstance(model, dict) and model.get("type") == "BPE" and set(model) <= _BPE_KEYS
            and isinstance(model.get("vocab"), dict) and isinstance(model.get("merges"), (list, DerivedMerges))
            and isinstance(added, list)
            and all(isinstance(d, dict) and set(d) == _ADDED_KEYS and isinstance(d["content"], str)
                    for d in added)):
        return None
    pairs = merge_pairs(model["merges"], source)
    if pairs is None:
        return None
    options = {k: model[k] for k in _BPE_KEYS - {"type", "vocab", "merges"} if model.get(k) is not None}
    try:
        bpe = tokenizers.models.BPE(model["vocab"], pairs, **options)
    except Exception as e:  # e.g. a merge naming a token the vocabulary lacks
        raise FormatError(f"{source}: the tokenizers library refused its BPE model: {e}") from None
    shell = dict(spec, added_tokens=[], model=dict(model, vocab={}, merges=[], unk_token=None))
    tok = tokenizers.Tokenizer.from_str(json.dumps(shell, ensure_ascii=False))
    tok.model = bpe
    # as the library's reader does: added after the model, each taking the model's id for its string
    tok.add_tokens([tokenizers.AddedToken(d["content"], single_word=d["single_word"], lstrip=d["lstrip"],
                                          rstrip=d["rstrip"], normalized=d["normalized"], special=d["special"])
                    for d in added])
    return tok


def _trim_heap():
    """Hand the heap the JSON parse freed back to the OS (glibc's malloc_trim; elsewhere nothing).
    Parsing a 151k-token vocabulary peaks about 60 MB above the built tokenizer, and glibc kept
    17 MB of that resident, freed but fragmented, through the whole run (Qwen2.5's vocabulary,
    measured with /proc/self/status)."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass
