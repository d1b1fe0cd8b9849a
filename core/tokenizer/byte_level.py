"""GPT-2's byte <-> printable character table used by byte-level BPE.

Every byte maps to one visible Unicode character so that a BPE vocabulary of
strings can hold arbitrary bytes ("Ġ" is the space byte 0x20).
"""
import functools

# The pre-split regex `tokenizers` uses for ByteLevel(use_regex=True): GPT-2's.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@functools.lru_cache(maxsize=None)
def byte_to_char():
    """List of 256 single-character strings, indexed by byte value."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


@functools.lru_cache(maxsize=None)
def char_to_byte():
    return {c: b for b, c in enumerate(byte_to_char())}


def encode_bytes(text):
    """Text -> its UTF-8 bytes spelled with the byte-level alphabet."""
    table = byte_to_char()
    return "".join([table[b] for b in text.encode("utf-8")])


@functools.lru_cache(maxsize=1 << 16)
def token_bytes(token):
    """Bytes a byte-level token stands for; a token with a character outside
    the alphabet (an added token such as "<|im_start|>" with odd characters)
    stands for its own UTF-8 bytes, as in the `tokenizers` library."""
    table = char_to_byte()
    try:
        return bytes([table[c] for c in token])
    except KeyError:
        return token.encode("utf-8")
