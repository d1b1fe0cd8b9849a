"""What every tallow weights reader has in common.

A reader maps the file (or wraps a buffer you already hold), parses and
validates the header, and keeps a TensorInfo per tensor. Nothing is copied
until you ask: `raw(name)` is a memoryview slice of the mapping and
`tensor(name)` builds a tensor over it. Over a ByteSource (byte_source.py,
e.g. a JS ArrayBuffer in the browser) the header comes from read() and each
tensor goes from the source to its device (directly, when the device can).
"""
import mmap
import os

from ..errors import FormatError


class TensorInfo:
    """Where one tensor lives: dtype (a tallow DType, or None when tallow cannot hold it),
    file_dtype (the format's own name for it), shape (row-major), nbytes and the
    absolute byte offset in the file. `problem` says why it cannot be loaded, if it cannot."""
    __slots__ = ("name", "dtype", "file_dtype", "shape", "nbytes", "offset", "problem")

    def __init__(self, name, dtype, file_dtype, shape, nbytes, offset, problem=None):
        self.name, self.dtype, self.file_dtype = name, dtype, file_dtype
        self.shape, self.nbytes, self.offset, self.problem = tuple(shape), nbytes, offset, problem

    def __repr__(self):
        dt = self.dtype.name if self.dtype is not None else self.file_dtype
        return f"TensorInfo({self.name!r}, {dt}, shape={self.shape}, nbytes={self.nbytes}, offset={self.offset})"


def map_source(source):
    """(read-only memoryview over the whole file or buffer, a name for error messages)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return memoryview(source).cast("B"), "<buffer>"
    path = os.fspath(source)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise FormatError(f"{path}: cannot open: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return memoryview(b""), path
        try:
            # the mapping stays valid after the file is closed
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)), path
        except (OSError, ValueError, AttributeError):  # no mmap (some Pyodide file systems)
            return memoryview(f.read()), path


class LazyFile:
    """Base of the readers: subclasses fill self.infos (name -> TensorInfo), self.metadata."""
    format = "?"

    def __init__(self, source):
        from .byte_source import is_byte_source
        if is_byte_source(source):
            self.source, self.data, self.path = source, memoryview(b""), source.name
            self.size = source.size
        else:
            self.source = None
            self.data, self.path = map_source(source)
            self.size = len(self.data)
        self.infos = {}
        self.metadata = {}

    # -- the common interface ---------------------------------------------------
    def keys(self):
        return list(self.infos)

    def __iter__(self):
        return iter(self.infos)

    def __len__(self):
        return len(self.infos)

    def __contains__(self, name):
        return name in self.infos

    def info(self, name):
        try:
            return self.infos[name]
        except KeyError:
            raise FormatError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name):
        """The tensor's bytes as stored (little-endian; GGUF blocks for quantised types), zero-copy."""
        info = self._loadable(name)
        return self._bytes(info.offset, info.nbytes)

    def tensor(self, name, device=None):
        from ..creation import from_buffer
        info = self._loadable(name)
        if self.source is not None:
            from .byte_source import direct_tensor
            t = direct_tensor(self.source, info, device)
            if t is not None:
                return t
        return from_buffer(self.raw(name), info.dtype, info.shape, device)

    def close(self):
        """Drop this reader's reference to the mapping or source (tensors made from it keep theirs)."""
        self.data = memoryview(b"")
        if self.source is not None:
            self.source = _ClosedSource(self.source)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<tallow.io {self.format} file {self.path!r}: {len(self.infos)} tensors>"

    # -- helpers for subclasses ---------------------------------------------------
    def _bytes(self, offset, nbytes):
        """nbytes at offset: a slice of the mapping (no copy), or read from the source."""
        if self.source is not None:
            return memoryview(self.source.read(offset, nbytes))
        return self.data[offset:offset + nbytes]

    def _loadable(self, name):
        info = self.info(name)
        if info.problem:
            raise FormatError(f"{self.path}: tensor {name!r}: {info.problem}")
        return info

    def _fail(self, problem, tensor=None):
        where = f"{self.path}: tensor {tensor!r}: " if tensor is not None else f"{self.path}: "
        raise FormatError(where + problem)

    def _check_extents(self, start, end):
        """Every tensor lies in [start, end) and no two overlap."""
        spans = sorted((i.offset, i.offset + i.nbytes, i.name) for i in self.infos.values())
        prev_end, prev_name = start, None
        for lo, hi, name in spans:
            if lo < start or hi > end:
                self._fail(f"data [{lo}, {hi}) lies outside the file's data section [{start}, {end})", name)
            if lo < prev_end and hi > lo:
                self._fail(f"data [{lo}, {hi}) overlaps tensor {prev_name!r}", name)
            if hi > lo:
                prev_end, prev_name = hi, name


class _ClosedSource:
    """What a closed reader holds instead of its source: reads fail with a clear message."""
    js_buffer = None

    def __init__(self, source):
        self.name, self.size = source.name, source.size

    def read(self, offset, size):
        raise FormatError(f"{self.name}: the reader was closed")


def numel_of(shape):
    n = 1
    for s in shape:
        n *= s
    return n
