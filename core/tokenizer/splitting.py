"""Split a string by a pattern, with the `tokenizers` library's delimiter behaviours.

Lazy: pieces come out as the regex finds them, so a 10 MB prompt never holds
a list of millions of spans (the lists took ~2 GB), and a caller counting
tokens can stop once it has enough.
"""
from ..errors import FormatError

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def find_matches(regex, text):
    """(start, end, is_match) spans covering all of `text`, in order."""
    if not text:
        yield (0, 0, False)
        return
    prev = 0
    for m in regex.finditer(text):
        start, end = m.span()
        if prev != start:
            yield (prev, start, False)
        yield (start, end, True)
        prev = end
    if prev != len(text):
        yield (prev, len(text), False)


def _spans(matches, behavior):
    if behavior in ("Isolated", "Removed"):
        for s, e, m in matches:
            if behavior == "Isolated" or not m:
                yield s, e
        return
    held = None  # (start, end, is_match) of the span not yet yielded
    for s, e, m in matches:
        if held is None:
            held = (s, e, m)
        elif behavior == "Contiguous" and m == held[2]:
            held = (held[0], e, m)
        elif behavior == "MergedWithPrevious" and m and not held[2]:
            held = (held[0], e, m)
        elif behavior == "MergedWithNext" and held[2] and not m:
            held = (held[0], e, False)  # a match joins the piece after it
        else:
            yield held[0], held[1]
            held = (s, e, m)
    if held is not None:
        yield held[0], held[1]


def split(regex, text, behavior, invert=False):
    """Pieces of `text` (never empty strings), lazily."""
    if behavior not in BEHAVIORS:
        raise FormatError(f"unknown split behavior {behavior!r} (expected one of {', '.join(BEHAVIORS)})")
    matches = find_matches(regex, text)
    if invert:
        matches = ((s, e, not m) for s, e, m in matches)
    return (text[s:e] for s, e in _spans(matches, behavior) if e > s)
