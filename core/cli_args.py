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


def non_negative_float(text):
    """temperature, min-p style values: finite and >= 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def positive_float(text):
    """repetition penalty: finite and > 0."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def probability(text):
    """top-p: a probability mass in (0, 1]."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def fraction(text):
    """min-p: in [0, 1]."""
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in [0, 1]")
    return value


def non_negative_int(text):
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def positive_int(text):
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return value


def port(text):
    value = _number(text, int)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (0 to 65535; 0 picks a free one)")
    return value
