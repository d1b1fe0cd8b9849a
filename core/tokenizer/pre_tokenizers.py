"""tokenizer.json pre-tokenizers: list of pieces -> list of pieces.

Each pre-tokenizer refines every current piece, as in the `tokenizers`
library; BPE then runs on each final piece separately.
"""
import re

from ..errors import FormatError
from .byte_level import GPT2_PATTERN, encode_bytes
from .splitting import split
from .unicode_classes import compile_pattern, property_class_body


def _split_pattern(spec):
    pattern = spec["pattern"]
    if "String" in pattern:
        return re.compile(re.escape(pattern["String"]))
    if "Regex" in pattern:
        return compile_pattern(pattern["Regex"])
    raise FormatError(f"Split pre-tokenizer pattern {pattern!r} is neither String nor Regex")


def _byte_level(spec):
    add_prefix_space = spec.get("add_prefix_space", False)
    regex = compile_pattern(GPT2_PATTERN) if spec.get("use_regex", True) else None

    def run(pieces):
        out = []
        for piece in pieces:
            if add_prefix_space and not piece.startswith(" "):
                piece = " " + piece
            out.extend(split(regex, piece, "Isolated") if regex is not None else [piece])
        return [encode_bytes(p) for p in out]
    return run


def _splitter(regex, behavior, invert=False):
    def run(pieces):
        out = []
        for piece in pieces:
            out.extend(split(regex, piece, behavior, invert))
        return out
    return run


def build(spec):
    """tokenizer.json "pre_tokenizer" object (or None) -> function(pieces) -> pieces."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "ByteLevel":
        return _byte_level(spec)
    if kind == "Split":
        return _splitter(_split_pattern(spec), spec.get("behavior", "Isolated"), spec.get("invert", False))
    if kind == "Digits":
        # Rust's char::is_numeric is the Unicode N category.
        digit = re.compile("[" + property_class_body("N") + "]")
        return _splitter(digit, "Isolated" if spec.get("individual_digits", False) else "Contiguous")
    if kind == "Sequence":
        steps = [build(s) for s in spec["pretokenizers"]]
        steps = [s for s in steps if s is not None]

        def run(pieces):
            for step in steps:
                pieces = step(pieces)
            return pieces
        return run
    raise FormatError(f"tokenizer pre_tokenizer type {kind!r} is not supported by tallow's pure-Python tokenizer")
