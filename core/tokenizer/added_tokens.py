"""Added tokens ("<|im_start|>", "<|endoftext|>", ...): found in raw text and
kept whole, before normalisation and pre-tokenization, as in `tokenizers`."""
import re

from .unicode_classes import is_white_space


class AddedToken:
    __slots__ = ("id", "content", "special", "normalized", "lstrip", "rstrip", "single_word")

    def __init__(self, id, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
        self.id = id
        self.content = content
        self.special = special
        self.normalized = normalized
        self.lstrip = lstrip
        self.rstrip = rstrip
        self.single_word = single_word

    @classmethod
    def from_json(cls, d):
        return cls(d["id"], d["content"], d.get("special", False), d.get("normalized", not d.get("special", False)),
                   d.get("lstrip", False), d.get("rstrip", False), d.get("single_word", False))


def _is_word_char(ch):
    return ch.isalnum() or ch == "_"


class AddedTokenMatcher:
    """Splits text into [(piece, id or None)] around occurrences of a set of added tokens."""

    def __init__(self, tokens):
        self.by_content = {t.content: t for t in tokens if t.content}
        # Longest first: `re` alternation is leftmost-first, so this is leftmost-longest.
        contents = sorted(self.by_content, key=len, reverse=True)
        self.regex = re.compile("|".join(re.escape(c) for c in contents)) if contents else None

    def split(self, text):
        """(piece, id or None) in order, lazily (a long prompt holds no list of pieces)."""
        if self.regex is None or not text:
            yield (text, None)
            return
        offset = 0
        for m in self.regex.finditer(text):
            start, stop = m.span()
            tok = self.by_content[m.group()]
            if tok.single_word:
                start_ok = start == 0 or not _is_word_char(text[start - 1])
                stop_ok = stop == len(text) or not _is_word_char(text[stop])
                if not (start_ok and stop_ok):
                    continue
            if tok.lstrip:
                s = start
                while s > 0 and is_white_space(text[s - 1]):
                    s -= 1
                start = max(s, offset)
            if tok.rstrip:
                while stop < len(text) and is_white_space(text[stop]):
                    stop += 1
            if offset < start:
                yield (text[offset:start], None)
            yield (text[start:stop], tok.id)
            offset = stop
        if offset < len(text):
            yield (text[offset:], None)
