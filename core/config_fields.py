"""Typed, range-checked reads of the fields a model takes from its config.json or
GGUF metadata. A field of the wrong type or out of range is a FormatError naming
the file, the key and the value ("<file>: <key> = <value>: must be ..."), raised
before the value can cause a ZeroDivisionError, an IndexError or a wrong model.
"""
import math

from .errors import FormatError

MISSING = object()
# Far beyond any checkpoint's layer, head, width or vocabulary count, so a count that is
# merely corrupt is refused before it sizes anything.
MAX_COUNT = 1 << 24


def _is_int(v):
    return type(v) is int or (type(v) is float and v.is_integer())  # 2048.0 in a config is 2048


class Fields:
    """The fields of one mapping: a parsed config.json, GGUF metadata (keys under `prefix`,
    e.g. "llama."), or a nested object (`label` names it in messages, e.g. "rope_scaling.")."""

    def __init__(self, raw, source, prefix="", label=None):
        self.raw, self.source, self.prefix = raw, source, prefix
        self.label = prefix if label is None else label

    def fail(self, key, value, need):
        raise FormatError(f"{self.source}: {self.label}{key} = {value!r:.80}: must be {need}")

    def has(self, key):
        return self.raw.get(self.prefix + key) is not None

    def get(self, key, default=MISSING):
        """The raw value; a missing (or null) key without a default is a FormatError."""
        value = self.raw.get(self.prefix + key)
        if value is None:
            if default is MISSING:
                raise FormatError(f"{self.source}: missing {self.label}{key}")
            return default
        return value

    def int(self, key, default=MISSING, lo=None, hi=None):
        """An integer in [lo, hi] (either bound optional)."""
        value = self.get(key, default)
        if value is None:
            return None
        if not _is_int(value):
            self.fail(key, value, "an integer")
        value = int(value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
            self.fail(key, value, f"an integer {bounds}")
        return value

    def positive_int(self, key, default=MISSING):
        return self.int(key, default, lo=1)

    def float(self, key, default=MISSING, positive=False, lo=None, hi=None):
        """A finite number (> 0 when positive; within [lo, hi] when given)."""
        value = self.get(key, default)
        if value is None:
            return None
        if type(value) not in (int, float) or not math.isfinite(value):
            self.fail(key, value, "a finite number")
        if positive and value <= 0:
            self.fail(key, value, "a number > 0")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.fail(key, value, f"a number in [{lo}, {hi}]")
        return float(value)

    def bool(self, key, default=MISSING):
        value = self.get(key, default)
        if type(value) is not bool and value not in (0, 1):
            self.fail(key, value, "true or false")
        return bool(value)

    def str(self, key, default=MISSING, choices=None):
        value = self.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, value, "a string")
        if choices is not None and value not in choices:
            self.fail(key, value, f"one of {', '.join(sorted(choices))}")
        return value

    def dict(self, key):
        """A JSON object, or {} when absent."""
        value = self.get(key, {})
        if not isinstance(value, dict):
            self.fail(key, value, "an object")
        return value

    def token_ids(self, key, vocab_size):
        """A token id or a list of them (eos_token_id may be either), each in [0, vocab_size)."""
        value = self.get(key, None)
        if value is None:
            return []
        ids = value if isinstance(value, list) else [value]
        for tid in ids:
            if type(tid) is not int or not 0 <= tid < vocab_size:
                self.fail(key, value, f"token ids in [0, {vocab_size}) (the vocabulary)")
        return list(ids)

    def token_id(self, key, vocab_size):
        """One optional token id in [0, vocab_size), or None."""
        value = self.get(key, None)
        if value is None:
            return None
        if type(value) is not int or not 0 <= value < vocab_size:
            self.fail(key, value, f"a token id in [0, {vocab_size}) (the vocabulary)")
        return value
