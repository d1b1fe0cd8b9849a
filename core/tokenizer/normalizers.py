"""tokenizer.json normalizers: text -> text, applied before pre-tokenization."""
import re
import unicodedata

from ..errors import FormatError
from .unicode_classes import compile_pattern, is_white_space


def _pattern(spec, owner):
    """A {"String": ...} or {"Regex": ...} pattern -> compiled `re` pattern."""
    if "String" in spec:
        return re.compile(re.escape(spec["String"]))
    if "Regex" in spec:
        return compile_pattern(spec["Regex"])
    raise FormatError(f"{owner} pattern {spec!r} is neither String nor Regex")


def _strip(left, right):
    def run(text):
        start, end = 0, len(text)
        if left:
            while start < end and is_white_space(text[start]):
                start += 1
        if right:
            while end > start and is_white_space(text[end - 1]):
                end -= 1
        return text[start:end]
    return run


# SentencePiece's "nmt_nfkc" clean-up, as the `tokenizers` library's Nmt normalizer does it:
# most ASCII control characters go, other space-like characters become a plain space.
_NMT_DROP = {c: None for c in [*range(0x01, 0x09), 0x0B, *range(0x0E, 0x20), 0x7F, 0x8F, 0x9F]}
_NMT_SPACE = {c: " " for c in [0x09, 0x0A, 0x0C, 0x0D, 0x1680, *range(0x200B, 0x2010), 0x2028, 0x2029,
                               0x2581, 0xFEFF, 0xFFFD]}
_NMT_TABLE = {**_NMT_DROP, **_NMT_SPACE}


def build(spec):
    """tokenizer.json "normalizer" object (or None) -> function(text) -> text."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: unicodedata.normalize(kind, text)
    if kind == "Nmt":
        return lambda text: text.translate(_NMT_TABLE)
    if kind == "Lowercase":
        return str.lower
    if kind == "Prepend":
        prefix = spec["prepend"]
        return lambda text: prefix + text if text else text
    if kind == "Replace":
        regex = _pattern(spec["pattern"], "Replace normalizer")
        content = spec["content"]
        return lambda text: regex.sub(lambda _m: content, text)
    if kind == "Strip":
        return _strip(spec.get("strip_left", True), spec.get("strip_right", True))
    if kind == "Sequence":
        steps = [build(s) for s in spec["normalizers"]]
        steps = [s for s in steps if s is not None]

        def run(text):
            for step in steps:
                text = step(text)
            return text
        return run
    raise FormatError(f"tokenizer normalizer type {kind!r} is not supported by tallow's pure-Python tokenizer")
