"""Reader for CTranslate2 `model.bin` files (the format faster-whisper ships).

Layout (little-endian): u32 version; for version >= 2 a u16-length-prefixed
spec name and a u32 revision; u32 tensor count; per tensor a u16-length-prefixed
NUL-padded name, u8 rank, rank x u32 dims, u8 dtype code, u32 byte count and
the bytes; for version >= 3 a u32 alias count and (alias, target) name pairs.

Only the headers are parsed on open: tensor bytes stay in the file (mmap when
the source is a path) until a tensor is asked for.
"""
import mmap
import struct

from ..errors import FormatError

# CTranslate2 dtype code -> (tallow dtype name, bytes per element, struct/numpy code)
DTYPES = {
    0: ("f32", 4, "<f4"),
    1: ("i8", 1, "<i1"),
    2: ("i16", 2, "<i2"),
    3: ("i32", 4, "<i4"),
    4: ("f16", 2, "<f2"),
    5: ("bf16", 2, "<u2"),  # bf16 travels as its raw 16 bits
}


class CTranslate2Tensor:
    """One tensor of a model.bin: its header, and its bytes on demand."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "_source")

    def __init__(self, name, dtype, shape, offset, nbytes, source):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.offset, self.nbytes, self._source = offset, nbytes, source

    def __repr__(self):
        return f"CTranslate2Tensor({self.name!r}, {self.dtype}, {self.shape})"

    def data(self):
        """The raw little-endian bytes, as a memoryview into the file (no copy)."""
        return memoryview(self._source)[self.offset:self.offset + self.nbytes]

    def numpy(self):
        """A read-only numpy view (bf16 comes back as uint16 bits)."""
        import numpy as np

        return np.frombuffer(self.data(), dtype=_code(self.dtype)).reshape(self.shape)

    def tensor(self, device=None):
        """A tallow tensor of these bytes; i16 is widened to i32 (tallow has no i16)."""
        from ..creation import from_buffer

        if self.dtype == "i16":
            values = struct.unpack(f"<{self.nbytes // 2}h", self.data())
            return from_buffer(struct.pack(f"<{len(values)}i", *values), "i32", self.shape, device=device)
        return from_buffer(self.data(), self.dtype, self.shape, device=device)


def _code(dtype_name):
    return next(code for name, _, code in DTYPES.values() if name == dtype_name)


class CTranslate2File:
    """A parsed model.bin: `version`, `spec`, `revision`, `tensors` (name ->
    CTranslate2Tensor) and `aliases` (alias name -> target name).
    `f[name]` resolves aliases; `close()` releases the mapping."""

    def __init__(self, source, name="<bytes>"):
        self.path = name
        self._map = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._buf = memoryview(source).cast("B")
        else:
            self.path = str(source)
            try:
                with open(source, "rb") as fh:
                    self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                self._map = b""
            except OSError as e:
                raise FormatError(f"{self.path}: cannot open CTranslate2 model: {e}") from e
            self._buf = memoryview(self._map)
        self._pos = 0
        self.tensors = {}
        self.aliases = {}
        self._parse()

    # ---- parsing ------------------------------------------------------------
    def _fail(self, what):
        raise FormatError(f"{self.path}: not a valid CTranslate2 model.bin: {what} (at byte {self._pos})")

    def _take(self, n, what):
        if self._pos + n > len(self._buf):
            self._fail(f"file ends inside {what} (needs {n} bytes, {len(self._buf) - self._pos} left)")
        start = self._pos
        self._pos += n
        return self._buf[start:self._pos]

    def _u(self, fmt, what):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]

    def _string(self, what):
        n = self._u("<H", f"{what} length")
        raw = bytes(self._take(n, what))
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            self._fail(f"{what} is not UTF-8: {raw[:40]!r}")

    def _parse(self):
        self.version = self._u("<I", "version")
        if not 1 <= self.version <= 6:
            self._fail(f"unsupported version {self.version} (this reader knows 1 to 6)")
        self.spec, self.revision = "", 1
        if self.version >= 2:
            self.spec = self._string("spec name")
            self.revision = self._u("<I", "spec revision")
        count = self._u("<I", "tensor count")
        for _ in range(count):
            self._read_tensor()
        if self.version >= 3:
            for _ in range(self._u("<I", "alias count")):
                alias = self._string("alias name")
                target = self._string("alias target")
                if target not in self.tensors:
                    self._fail(f"alias {alias!r} points to unknown tensor {target!r}")
                self.aliases[alias] = target
        if self._pos != len(self._buf):
            self._fail(f"{len(self._buf) - self._pos} unexpected bytes after the last record")

    def _read_tensor(self):
        name = self._string("tensor name")
        rank = self._u("<B", f"rank of {name!r}")
        shape = tuple(struct.unpack(f"<{rank}I", self._take(4 * rank, f"shape of {name!r}")))
        code = self._u("<B", f"dtype of {name!r}")
        if code not in DTYPES:
            self._fail(f"tensor {name!r} has unknown dtype code {code}")
        dtype, itemsize, _ = DTYPES[code]
        nbytes = self._u("<I", f"byte count of {name!r}")
        numel = 1
        for d in shape:
            numel *= d
        if nbytes != numel * itemsize:
            self._fail(f"tensor {name!r} {dtype}{list(shape)} needs {numel * itemsize} bytes, header says {nbytes}")
        offset = self._pos
        self._take(nbytes, f"data of {name!r}")
        if name in self.tensors:
            self._fail(f"tensor {name!r} appears twice")
        self.tensors[name] = CTranslate2Tensor(name, dtype, shape, offset, nbytes, self._buf)

    # ---- access -------------------------------------------------------------
    def __getitem__(self, name):
        found = self.tensors.get(self.aliases.get(name, name))
        if found is None:
            raise KeyError(f"{self.path}: no tensor or alias named {name!r}")
        return found

    def __contains__(self, name):
        return name in self.tensors or name in self.aliases

    def keys(self):
        """Tensor names followed by alias names."""
        return list(self.tensors) + list(self.aliases)

    def close(self):
        buf, self._buf = self._buf, None
        for t in self.tensors.values():
            t._source = None
        if isinstance(self._map, mmap.mmap):
            try:
                buf.release()
                self._map.close()
            except BufferError:  # a caller still holds a view; the GC closes the map later
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ctranslate2_spec(path):
    """The spec name ("WhisperSpec", ...) when the file at `path` starts like a CTranslate2
    model.bin (a version 2 to 6, then a spec name); None for anything else. Reads a few bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(6 + 256)
    except OSError:
        return None
    if len(head) < 6:
        return None
    version, length = struct.unpack("<IH", head[:6])
    spec = head[6:6 + length].rstrip(b"\0")
    if 2 <= version <= 6 and 0 < length <= 256 and spec.endswith(b"Spec") and spec.isascii():
        return spec.decode("ascii")
    return None


def is_ctranslate2_model(path):
    """True when the file at `path` starts like a CTranslate2 model.bin."""
    return ctranslate2_spec(path) is not None


def load_ctranslate2(source):
    """Open a CTranslate2 model.bin (a path, or bytes) without reading tensor data."""
    name = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)
    return CTranslate2File(source, name)
