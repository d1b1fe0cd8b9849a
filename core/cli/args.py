"""Validated argparse `type=` functions: a bad value is refused by the parser, as one
line naming the option's rule, before any model is loaded."""
import argparse
import math


def _number(text, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _checked(kind, ok, rule):
    """A `type=` function: parse as `kind` (floats must be finite), then require ok(value)."""
    def parse(text):
        value = _number(text, kind)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text} {rule}")
        return value
    return parse


non_negative_float = _checked(float, lambda v: v >= 0, "must be >= 0")      # temperature
positive_float = _checked(float, lambda v: v > 0, "must be > 0")            # repetition penalty
probability = _checked(float, lambda v: 0 < v <= 1, "must be in (0, 1]")    # top-p
fraction = _checked(float, lambda v: 0 <= v <= 1, "must be in [0, 1]")      # min-p
non_negative_int = _checked(int, lambda v: v >= 0, "must be >= 0")          # top-k
positive_int = _checked(int, lambda v: v >= 1, "must be >= 1")              # max tokens, beam size, workers


def bounded_int(low, high, why):
    """A `type=` function for a whole number from low to high; `why` says why the bound."""
    return _checked(int, lambda v: low <= v <= high, f"must be from {low} to {high} ({why})")


port = _checked(int, lambda v: 0 <= v <= 65535, "is not a TCP port (0 to 65535; 0 picks a free one)")
# 100 MB: GitHub Pages refuses bigger files (web/build.py's MAX_FILE_BYTES)
part_mb = _checked(float, lambda v: 0 < v <= 100,
                   "must be more than 0 and at most 100 (MB, the GitHub Pages file limit)")
