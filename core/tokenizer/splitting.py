"""Split a string by a pattern, with the `tokenizers` library's delimiter behaviours."""
from ..errors import FormatError

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def find_matches(regex, text):
    """[(start, end, is_match)] covering all of `text`."""
    if not text:
        return [(0, 0, False)]
    out = []
    prev = 0
    for m in regex.finditer(text):
        start, end = m.span()
        if prev != start:
            out.append((prev, start, False))
        out.append((start, end, True))
        prev = end
    if prev != len(text):
        out.append((prev, len(text), False))
    return out


def split(regex, text, behavior, invert=False):
    """Pieces of `text` (never empty strings)."""
    matches = find_matches(regex, text)
    if invert:
        matches = [(s, e, not m) for s, e, m in matches]
    if behavior == "Isolated":
        spans = [(s, e) for s, e, _ in matches]
    elif behavior == "Removed":
        spans = [(s, e) for s, e, m in matches if not m]
    elif behavior == "Contiguous":
        spans = []
        last_flag = None
        for s, e, m in matches:
            if spans and m == last_flag:
                spans[-1] = (spans[-1][0], e)
            else:
                spans.append((s, e))
            last_flag = m
    elif behavior == "MergedWithPrevious":
        spans = []
        previous_match = False
        for s, e, m in matches:
            if m and not previous_match and spans:
                spans[-1] = (spans[-1][0], e)
            else:
                spans.append((s, e))
            previous_match = m
    elif behavior == "MergedWithNext":
        spans = []
        previous_match = False
        for s, e, m in reversed(matches):
            if m and not previous_match and spans:
                spans[-1] = (s, spans[-1][1])
            else:
                spans.append((s, e))
            previous_match = m
        spans.reverse()
    else:
        raise FormatError(f"unknown split behavior {behavior!r} (expected one of {', '.join(BEHAVIORS)})")
    return [text[s:e] for s, e in spans if e > s]
