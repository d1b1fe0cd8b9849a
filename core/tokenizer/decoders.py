"""tokenizer.json decoders: list of token strings -> list of strings (joined by the caller).

Each decoder mirrors the `tokenizers` library's `decode_chain`, so chaining
them in a Sequence gives the library's text, U+FFFD replacements included.
"""
import re

from ..errors import FormatError
from .byte_level import token_bytes
from .pre_tokenizers import prepend_scheme

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")


def _byte_level(tokens):
    data = b"".join(token_bytes(t) for t in tokens)
    return [data.decode("utf-8", errors="replace")]


def _byte_fallback(tokens):
    out = []
    pending = bytearray()
    pending_count = 0

    def flush():
        nonlocal pending_count
        if pending_count:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                out.extend(["\ufffd"] * pending_count)  # the library's choice: one per byte token
            pending.clear()
            pending_count = 0

    for t in tokens:
        m = _BYTE_TOKEN.match(t) if len(t) == 6 else None
        if m:
            pending.append(int(m.group(1), 16))
            pending_count += 1
        else:
            flush()
            out.append(t)
    flush()
    return out


def _strip(content, start, stop):
    def run(tokens):
        out = []
        for t in tokens:
            chars = list(t)
            begin = 0
            for _ in range(start):
                if begin < len(chars) and chars[begin] == content:
                    begin += 1
                else:
                    break
            end = len(chars)
            for _ in range(stop):
                if end > begin and chars[end - 1] == content:
                    end -= 1
                else:
                    break
            out.append("".join(chars[begin:end]))
        return out
    return run


def _replace(spec):
    pattern = spec["pattern"]
    if "String" in pattern:
        regex = re.compile(re.escape(pattern["String"]))
    elif "Regex" in pattern:
        from .unicode_classes import compile_pattern
        regex = compile_pattern(pattern["Regex"])
    else:
        raise FormatError(f"Replace decoder pattern {pattern!r} is neither String nor Regex")
    content = spec["content"]
    return lambda tokens: [regex.sub(lambda _m: content, t) for t in tokens]


def _metaspace(spec):
    """"▁" back to spaces; in the first token every "▁" goes (the prepended space) unless
    prepend_scheme is "never" -- the `tokenizers` library's rule, kept exactly."""
    replacement = spec.get("replacement", "\u2581")
    strip_first = prepend_scheme(spec) != "never"

    def run(tokens):
        return [t.replace(replacement, "" if i == 0 and strip_first else " ") for i, t in enumerate(tokens)]
    return run


def build(spec):
    """tokenizer.json "decoder" object (or None) -> function(tokens) -> list of str."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "ByteLevel":
        return _byte_level
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Metaspace":
        return _metaspace(spec)
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        return _strip(spec["content"], spec.get("start", 0), spec.get("stop", 0))
    if kind == "Replace":
        return _replace(spec)
    if kind == "Sequence":
        steps = [build(s) for s in spec["decoders"]]
        steps = [s for s in steps if s is not None]

        def run(tokens):
            for step in steps:
                tokens = step(tokens)
            return tokens
        return run
    raise FormatError(f"tokenizer decoder type {kind!r} is not supported by tallow's pure-Python tokenizer")
