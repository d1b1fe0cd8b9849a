"""Read the key/value metadata block at the front of a GGUF file.

The tokenizer needs only the metadata (vocabulary, merges, special ids,
chat template), never the tensors, so this reads the header and stops.
"""
import struct

from ..errors import FormatError

_SCALARS = {  # GGUF value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9
_CHUNK = 1 << 20


class _Reader:
    """Buffered little-endian reads that say which file ended early."""

    def __init__(self, f, path):
        self.f = f
        self.path = path
        self.buf = b""
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            more = self.f.read(max(n, _CHUNK))
            self.buf = self.buf[self.pos:] + more
            self.pos = 0
            if n > len(self.buf):
                raise FormatError(f"{self.path}: GGUF metadata is truncated")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        raw = self.take(self.unpack("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype == _STRING:
                return [self.string() for _ in range(count)]
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                return list(struct.unpack("<%d%s" % (count, fmt[1]), self.take(size * count)))
            return [self.value(etype) for _ in range(count)]
        raise FormatError(f"{self.path}: unknown GGUF metadata value type {vtype}")


def read_metadata(path):
    """GGUF file -> {key: value}, arrays as lists."""
    with open(path, "rb") as f:
        r = _Reader(f, path)
        if r.take(4) != b"GGUF":
            raise FormatError(f"{path}: not a GGUF file (bad magic)")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise FormatError(f"{path}: GGUF version {version} is not supported (2 or 3; big-endian files are not)")
        r.unpack("<Q")  # tensor count
        kv_count = r.unpack("<Q")
        meta = {}
        for _ in range(kv_count):
            key = r.string()
            meta[key] = r.value(r.unpack("<I"))
        return meta
