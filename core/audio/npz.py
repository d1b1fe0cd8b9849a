"""A small pure-Python reader for numpy .npz / .npy files (no numpy needed),
enough for Whisper's mel_filters.npz: little-endian numeric arrays, C order."""
import ast
import io
import struct
import sys
import zipfile
from array import array

from ..errors import FormatError

# numpy descr -> array.array typecode (sizes checked on use)
_CODES = {"f4": "f", "f8": "d", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q"}


class NpyArray:
    """An array read from a .npy: `descr` ('<f4'), `shape`, raw bytes in `data`."""

    __slots__ = ("descr", "shape", "data")

    def __init__(self, descr, shape, data):
        self.descr, self.shape, self.data = descr, shape, data

    def flat(self):
        """All elements, row-major, as an array.array."""
        code = _CODES[self.descr[1:]]
        out = array(code)
        out.frombytes(self.data)
        if (self.descr[0] == ">") != (sys.byteorder == "big") and out.itemsize > 1:
            out.byteswap()
        return out

    def rows(self):
        """A 2-D array as a list of array.array rows."""
        if len(self.shape) != 2:
            raise FormatError(f"expected a 2-D array, got shape {self.shape}")
        flat, width = self.flat(), self.shape[1]
        return [flat[i * width:(i + 1) * width] for i in range(self.shape[0])]

    def numpy(self):
        import numpy as np

        return np.frombuffer(self.data, dtype=self.descr).reshape(self.shape)


def parse_npy(raw, name="<npy>"):
    raw = bytes(raw)
    if raw[:6] != b"\x93NUMPY":
        raise FormatError(f"{name}: not a .npy array (bad magic {raw[:6]!r})")
    major = raw[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", raw, 8), 10
    elif major in (2, 3):
        (hlen,), start = struct.unpack_from("<I", raw, 8), 12
    else:
        raise FormatError(f"{name}: unsupported .npy version {major}")
    try:
        header = ast.literal_eval(raw[start:start + hlen].decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise FormatError(f"{name}: unreadable .npy header: {e}") from e
    if not isinstance(descr, str) or descr[1:] not in _CODES or descr[0] not in "<>|":
        raise FormatError(f"{name}: unsupported .npy dtype {descr!r} (numeric little/big-endian only)")
    if fortran and len(shape) > 1:
        raise FormatError(f"{name}: Fortran-ordered .npy arrays are not supported")
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * int(descr[2:])
    data = raw[start + hlen:start + hlen + nbytes]
    if len(data) != nbytes:
        raise FormatError(f"{name}: truncated .npy: {descr}{list(shape)} needs {nbytes} bytes, has {len(data)}")
    return NpyArray(descr, shape, data)


def read_npz(source):
    """{array name: NpyArray} of a .npz given as a path or bytes."""
    name = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)
    try:
        fh = io.BytesIO(bytes(source)) if name == "<bytes>" else open(source, "rb")
        with fh, zipfile.ZipFile(fh) as z:
            return {m[:-4] if m.endswith(".npy") else m: parse_npy(z.read(m), f"{name}:{m}") for m in z.namelist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise FormatError(f"{name}: cannot read .npz: {e}") from e
