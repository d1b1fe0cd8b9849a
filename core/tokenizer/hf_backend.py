"""The `tokenizers` library (Rust) behind tallow's tokenizer interface."""
import json

from ..errors import FormatError, UnsupportedError


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
        try:
            # unescaped text parses faster (byte-level vocabularies are mostly non-ASCII): -20 ms
            self.tok = tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
        except Exception as e:  # the library raises plain Exception on bad JSON
            raise FormatError(f"{source}: the tokenizers library refused it: {e}") from None
        self.size = self.tok.get_vocab_size(with_added_tokens=True)
        _trim_heap()


    def token_to_id(self, token):
        return self.tok.token_to_id(token)

    def id_to_token(self, tid):
        return self.tok.id_to_token(tid)

    def encode(self, text, add_special_tokens=True):
        try:
            return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as e:  # e.g. a Unigram model meeting an unknown character with no unk_id
            raise FormatError(f"the tokenizers library cannot encode {text!r:.60}: {e}") from None

    def _check(self, ids):
        for tid in ids:
            if not 0 <= tid < self.size:
                raise FormatError(f"token id {tid} is outside the vocabulary (size {self.size})")

    def decode(self, ids, skip_special_tokens=False):
        ids = list(ids)
        self._check(ids)
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


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
