"""tokenizer.json pre-tokenizers: list of pieces -> list of pieces.

Each pre-tokenizer refines every current piece, as in the `tokenizers`
library; the model (BPE, Unigram) then runs on each final piece separately.
`first` says whether pieces[0] begins the text (nothing, not even an added
token, before it): Metaspace's prepend_scheme "first" needs to know.
"""
import itertools
import re

from ..errors import FormatError
from .byte_level import GPT2_PATTERN, encode_bytes
from .splitting import BEHAVIORS, split
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

    def run(pieces, first=False):
        for piece in pieces:
            if add_prefix_space and not piece.startswith(" "):
                piece = " " + piece
            for p in (split(regex, piece, "Isolated") if regex is not None else (piece,)):
                yield encode_bytes(p)
    return run


def _metaspace(spec):
    """SentencePiece's convention: spaces become "▁", a "▁" is prepended (always, to the
    text's first piece only, or never), and with split=True each "▁" starts a new piece."""
    replacement = spec.get("replacement", "\u2581")
    if not isinstance(replacement, str) or len(replacement) != 1:
        raise FormatError(f"Metaspace replacement {replacement!r} must be one character")
    scheme = prepend_scheme(spec)
    split_on = re.compile(re.escape(replacement)) if spec.get("split", True) else None

    def run(pieces, first=False):
        for i, piece in enumerate(pieces):
            piece = piece.replace(" ", replacement)
            if not piece.startswith(replacement) and (scheme == "always" or (scheme == "first" and first and i == 0)):
                piece = replacement + piece
            yield from (split(split_on, piece, "MergedWithNext") if split_on is not None else (piece,))
    return run


def prepend_scheme(spec):
    """prepend_scheme, or the older add_prefix_space flag it replaced."""
    scheme = spec.get("prepend_scheme")
    if scheme is None:
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never"):
        raise FormatError(f"Metaspace prepend_scheme {scheme!r} must be 'always', 'first' or 'never'")
    return scheme


def _splitter(regex, behavior, invert=False):
    if behavior not in BEHAVIORS:
        raise FormatError(f"Split behavior {behavior!r} is not one of {', '.join(BEHAVIORS)}")

    def run(pieces, first=False):
        for piece in pieces:
            yield from split(regex, piece, behavior, invert)
    return run


def _chained(step, pieces, first):
    """(step's pieces, whether their first still begins the text), reading both lazily."""
    if not first:
        return step(pieces, False), False
    pieces = iter(pieces)
    head = next(pieces, None)
    if head is None:
        return iter(()), False
    out = iter(step(itertools.chain((head,), pieces), True))
    lead = next(out, None)
    if lead is None:
        return iter(()), False
    # Still the text's start only if this step kept the first piece's beginning.
    return itertools.chain((lead,), out), head.startswith(lead)


def build(spec):
    """tokenizer.json "pre_tokenizer" object (or None) -> function(pieces) -> iterable of pieces,
    computed lazily (one piece at a time, whatever the text's length)."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "ByteLevel":
        return _byte_level(spec)
    if kind == "Split":
        return _splitter(_split_pattern(spec), spec.get("behavior", "Isolated"), spec.get("invert", False))
    if kind == "Metaspace":
        return _metaspace(spec)
    if kind == "Digits":
        # Rust's char::is_numeric is the Unicode N category.
        digit = re.compile("[" + property_class_body("N") + "]")
        return _splitter(digit, "Isolated" if spec.get("individual_digits", False) else "Contiguous")
    if kind == "Sequence":
        steps = [build(s) for s in spec["pretokenizers"]]
        steps = [s for s in steps if s is not None]

        def run(pieces, first=False):
            for step in steps:
                pieces, first = _chained(step, pieces, first)
            return pieces
        return run
    raise FormatError(f"tokenizer pre_tokenizer type {kind!r} is not supported by tallow's pure-Python tokenizer")
