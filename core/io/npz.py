"""numpy .npz archives (a zip of .npy files), read without numpy.

Uncompressed members (np.savez) are served zero-copy from the mapped file;
compressed ones (np.savez_compressed) are inflated when a tensor is asked for.
"""
import ast
import io
import struct
import zipfile

from ..dtypes import get_dtype
from .lazy_file import LazyFile, TensorInfo, numel_of

# .npy descr -> tallow dtype name ('<' little-endian, '|' byte-sized)
DESCR = {"<f8": "f64", "<f4": "f32", "<f2": "f16", "<i8": "i64", "<i4": "i32", "|i1": "i8", "|u1": "u8",
         "<u4": "u32", "|b1": "bool"}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length


class NpzFile(LazyFile):
    format = "npz"

    def __init__(self, source):
        super().__init__(source)
        if self.source is not None:  # a zip's directory is at its end: npz files (small) are read whole
            self.data, self.source = memoryview(self.source.read(0, self.size)), None
        try:
            self._zip = zipfile.ZipFile(_ReadOnly(self.data))
            members = self._zip.infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            self._fail(f"not a valid zip archive ({e})")
        self._inflated = {}
        self._compressed = {}
        for m in members:
            if not m.filename.endswith(".npy"):
                continue
            name = m.filename[:-4]
            self.infos[name] = self._member(name, m)
        self._check_extents(0, len(self.data))

    def _member(self, name, m):
        if m.compress_type == zipfile.ZIP_STORED:
            at = m.header_offset
            if at + _LOCAL_HEADER.size > len(self.data):
                self._fail("zip local header lies past the end of the file", name)
            sig, n, extra = _LOCAL_HEADER.unpack_from(self.data, at)
            if sig != b"PK\x03\x04":
                self._fail("bad zip local header signature", name)
            start = at + _LOCAL_HEADER.size + n + extra
            head = bytes(self.data[start:start + min(m.file_size, 65536 + 10)])
        else:
            start = None
            try:
                with self._zip.open(m) as f:
                    head = f.read(min(m.file_size, 65536 + 10))
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
                self._fail(f"cannot read the compressed member ({e})", name)
        descr, fortran, shape, header_len = self._npy_header(name, head)
        problem = None
        if descr not in DESCR:
            problem = f".npy dtype {descr!r} is not supported by tallow (supported: {', '.join(DESCR)})"
            dtype, itemsize = None, _itemsize(descr)
        else:
            dtype = get_dtype(DESCR[descr])
            itemsize = dtype.itemsize
        if fortran and len(shape) > 1:
            problem = "is stored in Fortran (column-major) order; save it with np.ascontiguousarray"
        nbytes = numel_of(shape) * itemsize
        if header_len + nbytes != m.file_size:
            self._fail(f".npy header says shape {shape} of {descr} ({nbytes} bytes) "
                       f"but the member holds {m.file_size - header_len}", name)
        if start is None:
            self._compressed[name] = (m, header_len)
            return TensorInfo(name, dtype, descr, shape, nbytes, 0, problem)
        return TensorInfo(name, dtype, descr, shape, nbytes, start + header_len, problem)

    def _npy_header(self, name, head):
        if head[:6] != b"\x93NUMPY" or len(head) < 10:
            self._fail("not a .npy member (bad magic)", name)
        major = head[6]
        if major == 1:
            (hlen,), at = struct.unpack_from("<H", head, 8), 10
        elif major in (2, 3):
            if len(head) < 12:
                self._fail("truncated .npy header", name)
            (hlen,), at = struct.unpack_from("<I", head, 8), 12
        else:
            self._fail(f".npy format version {major} is not supported", name)
        if at + hlen > len(head):
            self._fail(f".npy header length {hlen} runs past the member", name)
        try:
            d = ast.literal_eval(head[at:at + hlen].decode("utf-8" if major == 3 else "latin-1"))
            descr, fortran, shape = d["descr"], d["fortran_order"], tuple(d["shape"])
        except (ValueError, SyntaxError, KeyError, TypeError, UnicodeDecodeError, MemoryError, RecursionError):
            self._fail(".npy header is not a valid {'descr', 'fortran_order', 'shape'} dict", name)
        if not isinstance(descr, str) or not all(type(s) is int and s >= 0 for s in shape):
            self._fail(f".npy header has descr {descr!r} / shape {shape!r}", name)
        return descr, bool(fortran), shape, at + hlen

    def raw(self, name):
        info = self._loadable(name)
        if name not in self._compressed:
            return self.data[info.offset:info.offset + info.nbytes]
        if name not in self._inflated:
            m, header_len = self._compressed[name]
            try:
                with self._zip.open(m) as f:
                    body = f.read()[header_len:]
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
                self._fail(f"cannot inflate the compressed member ({e})", name)
            self._inflated[name] = memoryview(body)
        return self._inflated[name]

    def _check_extents(self, start, end):
        stored = {n: i for n, i in self.infos.items() if n not in self._compressed}
        saved, self.infos = self.infos, stored
        try:
            super()._check_extents(start, end)
        finally:
            self.infos = saved


def _itemsize(descr):
    digits = "".join(ch for ch in descr if ch.isdigit())
    return int(digits) if digits else 1


class _ReadOnly(io.RawIOBase):
    """A seekable file over a memoryview, so zipfile reads the mapping without copying it."""

    def __init__(self, mv):
        self._mv, self._pos = mv, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=0):
        self._pos = [pos, self._pos + pos, len(self._mv) + pos][whence]
        return self._pos

    def readinto(self, b):
        n = max(0, min(len(b), len(self._mv) - self._pos))
        b[:n] = self._mv[self._pos:self._pos + n]
        self._pos += n
        return n
