"""Unicode property classes for the stdlib `re` module.

Tokenizer pre-split regexes are written for Oniguruma / PCRE and use \\p{L},
\\p{N} and a Unicode-wide \\s. Pyodide has only `re`, which knows none of the
\\p{...} classes and whose \\s also matches U+001C..U+001F. So we build explicit
character classes from `unicodedata` once, cache them, and rewrite patterns.
"""
import functools
import sys
import unicodedata

from ..errors import FormatError

# Unicode's White_Space property (PropList.txt); stable since Unicode 6.3.
WHITE_SPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
     0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)

_CATEGORY_GROUPS = {
    "L": ("Lu", "Ll", "Lt", "Lm", "Lo"),
    "N": ("Nd", "Nl", "No"),
    "P": ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"),
    "S": ("Sm", "Sc", "Sk", "So"),
    "M": ("Mn", "Mc", "Me"),
    "Z": ("Zs", "Zl", "Zp"),
}
_ALIASES = {"Letter": "L", "Number": "N", "Punctuation": "P", "Symbol": "S", "Mark": "M"}


def _ranges(codepoints):
    """Sorted code points -> [(first, last)] runs."""
    runs = []
    for cp in codepoints:
        if runs and runs[-1][1] == cp - 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return runs


def _escape(cp):
    return "\\U%08x" % cp


def _class_body(codepoints):
    """The inside of a [...] class matching exactly `codepoints`."""
    parts = []
    for first, last in _ranges(codepoints):
        parts.append(_escape(first) if first == last else _escape(first) + "-" + _escape(last))
    return "".join(parts)


@functools.lru_cache(maxsize=None)
def _categories_by_codepoint():
    table = {}
    for cp in range(sys.maxunicode + 1):
        table.setdefault(unicodedata.category(chr(cp)), []).append(cp)
    return table


@functools.lru_cache(maxsize=None)
def property_class_body(name):
    """Class body for \\p{name}: a general category (L, Lu, N, Nd, ...) or White_Space."""
    name = _ALIASES.get(name, name)
    if name in ("White_Space", "space"):
        return _class_body(sorted(WHITE_SPACE))
    cats = _CATEGORY_GROUPS.get(name, (name,))
    table = _categories_by_codepoint()
    if not all(c in table for c in cats):
        raise FormatError(f"tokenizer regex uses the Unicode property \\p{{{name}}}, which tallow does not know")
    return _class_body(sorted(cp for c in cats for cp in table[c]))


def _read_property(pattern, i):
    """Parse the property at pattern[i:] after '\\p' / '\\P'; return (name, next index)."""
    if i < len(pattern) and pattern[i] == "{":
        end = pattern.find("}", i)
        if end < 0:
            raise FormatError(f"tokenizer regex {pattern!r}: unterminated \\p{{")
        return pattern[i + 1:end], end + 1
    return pattern[i], i + 1


@functools.lru_cache(maxsize=64)
def translate(pattern):
    """Rewrite an Oniguruma-style pattern into one the stdlib `re` runs identically.

    \\p{X} / \\P{X} / \\s / \\S become explicit classes, inside or outside [...].
    A negated property inside a class ([^\\s\\p{L}] is fine, [\\P{L}] is not)
    cannot be expressed as a union, so it is refused.
    """
    out = []
    in_class = False
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt in "pP":
                name, i = _read_property(pattern, i + 2)
                negated = nxt == "P"
                if name.startswith("^"):
                    name, negated = name[1:], not negated
                body = property_class_body(name)
                if in_class:
                    if negated:
                        raise FormatError(f"tokenizer regex {pattern!r}: negated property inside [...] is unsupported")
                    out.append(body)
                else:
                    out.append(("[^" if negated else "[") + body + "]")
                continue
            if nxt in "sS":
                body = property_class_body("White_Space")
                if in_class:
                    if nxt == "S":
                        raise FormatError(f"tokenizer regex {pattern!r}: \\S inside [...] is unsupported")
                    out.append(body)
                else:
                    out.append(("[" if nxt == "s" else "[^") + body + "]")
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            i += 1
            # A ']' right after '[' or '[^' is a literal, not the end of the class.
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("\\]")
                i += 1
            continue
        if ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern):
    """Compile an Oniguruma-style tokenizer regex with the stdlib `re`."""
    import re

    from .regex_safety import check
    check(pattern)
    try:
        return re.compile(translate(pattern))
    except (re.error, RecursionError, OverflowError) as e:
        raise FormatError(f"tokenizer regex {pattern!r:.80} cannot be compiled: {e}") from None


def is_white_space(ch):
    return ord(ch) in WHITE_SPACE
