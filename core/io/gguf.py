"""GGUF (versions 2 and 3): read (memory-mapped, validated, lazy) and write.

Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata
count; metadata as (string key, u32 value type, value); tensor infos as
(string name, u32 n_dims, u64 dims innermost-first, u32 ggml type, u64 offset);
padding to `general.alignment` (default 32); the tensor data, each tensor at
an aligned offset relative to the start of the data section.
Shapes are exposed row-major (outermost first), like numpy and gguf.GGUFReader.
"""
import struct

from ..dtypes import get_dtype
from ..errors import FormatError
from ..quant.formats import DTYPE_TO_GGML, GGML_TO_DTYPE, GGML_TYPES
from .atomic_output import atomic_output
from .lazy_file import LazyFile, TensorInfo, numel_of
from .tensor_parts import tensor_parts

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8
MAX_NESTING = 16
# Bounds on the Python objects a header may make us build, far above real files (the largest
# vocabularies hold ~260k tokens, so tokens + merges + types + scores stay under ~2M values;
# arrays of arrays are rare and short). Without them a 96 MB file of 8M empty nested arrays
# took tens of seconds and ~2 GB to open.
MAX_METADATA_VALUES = 1 << 22
MAX_NESTED_ARRAYS = 1 << 16
MAX_TENSORS = 1 << 18  # real checkpoints hold thousands

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
           BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}
_SIZE = {t: struct.calcsize(c) for t, c in _SCALAR.items()}
_MIN_SIZE = {**_SIZE, STRING: 8, ARRAY: 12}  # smallest encoding of one value of each type
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# Over a byte source the header is parsed from a prefix of this size, grown when it is too short.
FIRST_PREFIX = 4 << 20


class _NeedMore(Exception):
    """The header runs past the prefix read so far (not past the file): read `end` bytes and parse again."""

    def __init__(self, end):
        self.end = end


class _Cursor:
    """Reads the header; every read is bounds-checked so a corrupt file fails cleanly."""

    def __init__(self, data, path, file_size):
        # size: the bytes at hand (the whole file, or a prefix of it); file_size: the whole file's
        self.data, self.pos, self.path, self.size, self.file_size = data, 0, path, len(data), file_size
        self.what = "header"
        self.values_left, self.nested_left = MAX_METADATA_VALUES, MAX_NESTED_ARRAYS

    def fail(self, problem):
        raise FormatError(f"{self.path}: {self.what}: {problem}")

    def need(self, n):
        if n > self.size - self.pos:
            if n <= self.file_size - self.pos:
                raise _NeedMore(self.pos + n)
            self.fail(f"truncated: needs {n} bytes at offset {self.pos}, the file has {self.file_size}")

    def u32(self):
        self.need(4)
        v = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def u64(self):
        self.need(8)
        v = _U64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return v

    def string(self):
        n = self.u64()
        self.need(n)
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"string at offset {self.pos - n} is not UTF-8 ({e.reason})")

    def strings(self, n):
        """n strings: the vocabulary case (~150k tokens, as many merges). The loop only cuts the
        bytes; they are decoded in one call, joined by NUL bytes (a NUL ends any UTF-8 sequence,
        so the whole is valid exactly when every part is) and split again: -20% of the loop.
        A string holding a NUL itself, bad UTF-8, or a run past the bytes at hand goes the
        one-by-one way, which finds and names the fault."""
        parts, starts, pos = self._cut_strings(n)
        if len(parts) == n:
            joined = b"\0".join(parts)
            if joined.count(b"\0") == n - 1:
                try:
                    out = joined.decode("utf-8").split("\0")
                except UnicodeDecodeError:
                    pass
                else:
                    self.pos = pos
                    return out
        out = []
        for raw, start in zip(parts, starts):
            try:
                out.append(str(raw, "utf-8"))
            except UnicodeDecodeError as e:
                self.pos = start
                self.fail(f"string at offset {start} is not UTF-8 ({e.reason})")
        self.pos = pos
        if len(out) < n:
            if self.size < self.file_size:
                raise _NeedMore(pos + 8)  # the prefix grows at least 4x per retry
            self.fail(f"truncated: string {len(out)} of {n} at offset {pos} runs past the end ({self.size} bytes)")
        return out

    def _cut_strings(self, n):
        """(the bytes of up to n strings, where each one's bytes start, the position after the
        last whole one, or where the next one ran past the bytes at hand)."""
        data, pos, size, unpack = self.data, self.pos, self.size, _U64.unpack_from
        parts, starts = [], []
        for _ in range(n):
            if pos + 8 > size:
                break
            ln = unpack(data, pos)[0]
            pos += 8
            if ln > size - pos:
                break
            starts.append(pos)
            parts.append(data[pos:pos + ln])
            pos += ln
        return parts, starts, pos

    def count(self, n, min_size, what):
        """A count read from the file, refused before looping when it cannot fit."""
        if n * min_size > self.file_size - self.pos:
            self.fail(f"{what} count {n} cannot fit in the remaining {self.file_size - self.pos} bytes")
        return n

    def spend(self, n, nested):
        """Charge n array elements to the header's budgets before building them."""
        self.values_left -= n
        if self.values_left < 0:
            self.fail(f"the metadata arrays hold more than {MAX_METADATA_VALUES} values in all (a real GGUF "
                      f"holds a few hundred thousand)")
        if nested:
            self.nested_left -= n
            if self.nested_left < 0:
                self.fail(f"more than {MAX_NESTED_ARRAYS} arrays nested inside metadata arrays in all "
                          f"(this array alone holds {n})")

    def value(self, vtype, depth=0):
        """(value, type descriptor): scalars' descriptor is the type code; arrays'
        is (ARRAY, element code), or (ARRAY, [descriptor per element]) for arrays of arrays."""
        if vtype in _SCALAR:
            self.need(_SIZE[vtype])
            v = struct.unpack_from("<" + _SCALAR[vtype], self.data, self.pos)[0]
            self.pos += _SIZE[vtype]
            return v, vtype
        if vtype == STRING:
            return self.string(), STRING
        if vtype == ARRAY:
            if depth >= MAX_NESTING:
                self.fail(f"arrays nested deeper than {MAX_NESTING}")
            etype = self.u32()
            if etype not in _MIN_SIZE:
                self.fail(f"unknown array element type {etype}")
            n = self.count(self.u64(), _MIN_SIZE[etype], "array")
            self.spend(n, etype == ARRAY)
            if etype in _SCALAR:
                self.need(n * _SIZE[etype])
                values = list(struct.unpack_from(f"<{n}{_SCALAR[etype]}", self.data, self.pos))
                self.pos += n * _SIZE[etype]
                return values, (ARRAY, etype)
            if etype == STRING:
                return self.strings(n), (ARRAY, STRING)
            items = [self.value(ARRAY, depth + 1) for _ in range(n)]
            return [v for v, _ in items], (ARRAY, [t for _, t in items])
        self.fail(f"unknown value type {vtype}")


class GGUFFile(LazyFile):
    format = "gguf"

    def __init__(self, source):
        super().__init__(source)
        # A mapped file is parsed in place; a byte source from a prefix, re-read longer if the header needs it.
        head = self._bytes(0, self.size if self.source is None else min(self.size, FIRST_PREFIX))
        while True:
            try:
                self._parse_header(head)
                return
            except _NeedMore as more:
                head = self._bytes(0, min(self.size, max(more.end, 4 * len(head))))

    def _parse_header(self, head):
        self.metadata, self.infos = {}, {}
        c = _Cursor(head, self.path, self.size)
        c.need(4)
        if bytes(head[:4]) != MAGIC:
            self._fail(f"not a GGUF file (starts with {bytes(head[:4])!r}, expected b'GGUF')")
        c.pos = 4
        self.version = c.u32()
        if self.version not in (2, 3):
            self._fail(f"GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = c.count(c.u64(), 24, "tensor")
        if n_tensors > MAX_TENSORS:
            c.fail(f"tensor count {n_tensors} is more than the {MAX_TENSORS} tallow reads (real files hold thousands)")
        n_kv = c.count(c.u64(), 12, "metadata")
        self.metadata_types = {}
        for i in range(n_kv):
            c.what = f"metadata entry {i}"
            key = c.string()
            c.what = f"metadata {key!r}"
            if key in self.metadata:
                c.fail("duplicate key")
            self.metadata[key], self.metadata_types[key] = c.value(c.u32())
        self.alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(self.alignment) is not int or self.alignment <= 0 or self.alignment & (self.alignment - 1):
            self._fail(f"general.alignment {self.alignment!r} is not a power of two")
        entries = []
        for i in range(n_tensors):
            c.what = f"tensor info {i}"
            name = c.string()
            c.what = f"tensor {name!r}"
            n_dims = c.u32()
            if n_dims > MAX_DIMS:
                c.fail(f"{n_dims} dimensions (at most {MAX_DIMS})")
            dims = [c.u64() for _ in range(n_dims)]
            entries.append((name, dims, c.u32(), c.u64()))
        self.data_start = -(-c.pos // self.alignment) * self.alignment
        if self.data_start > self.size and n_tensors:
            self._fail(f"truncated: the data section would start at {self.data_start}, "
                       f"past the end ({self.size} bytes)")
        for name, dims, type_id, offset in entries:
            if name in self.infos:
                self._fail("duplicate tensor name", name)
            self.infos[name] = self._tensor_info(name, dims, type_id, offset)
        self._check_extents(self.data_start, self.size)
        self._check_accounted(self.data_start, self.size)

    def _check_accounted(self, start, end):
        """The tensors account for the whole data section: from its start, each tensor runs up
        to the next one's offset (the last to the end of the file) with only alignment padding
        between. A tensor declared with a type or shape smaller than the bytes stored for it
        (Q4_0 over Q8_0 data, F16 over F32, a K-quant relabelled) would otherwise load and
        compute garbage from the wrong bytes; one declared larger already overlaps its neighbour."""
        spans = sorted((i.offset, i.nbytes, i.name) for i in self.infos.values())
        if spans and spans[0][0] - start >= self.alignment:
            self._fail(f"{spans[0][0] - start} bytes at the start of the data section belong to no tensor "
                       "(the first tensor should start there)", spans[0][2])
        for k, (lo, nbytes, name) in enumerate(spans):
            following = spans[k + 1][0] if k + 1 < len(spans) else end
            if following - (lo + nbytes) >= self.alignment:
                info = self.infos[name]
                where = f"before tensor {spans[k + 1][2]!r}" if k + 1 < len(spans) else "before the end of the file"
                self._fail(f"declared {info.file_dtype} {list(info.shape)}, which is {nbytes} bytes, but "
                           f"{following - lo} bytes are stored for it ({where}; only padding to the "
                           f"{self.alignment}-byte alignment may follow a tensor): its type or shape is wrong", name)

    def _tensor_info(self, name, dims, type_id, offset):
        if type_id not in GGML_TYPES:
            self._fail(f"unknown ggml type id {type_id}", name)
        type_name, block_size, block_bytes = GGML_TYPES[type_id]
        if dims and dims[0] % block_size:
            self._fail(f"row length {dims[0]} is not a multiple of {type_name}'s block size {block_size}", name)
        if offset % self.alignment:
            self._fail(f"data offset {offset} is not a multiple of the alignment {self.alignment}", name)
        nbytes = numel_of(dims) // block_size * block_bytes
        shape = tuple(reversed(dims))
        dtype_name = GGML_TO_DTYPE.get(type_id)
        dtype = get_dtype(dtype_name) if dtype_name else None
        problem = None if dtype else f"ggml type {type_name} is not supported by tallow"
        return TensorInfo(name, dtype, type_name, shape, nbytes, self.data_start + offset, problem)


# -- writing ---------------------------------------------------------------------

def _infer_type(value):
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        if 0 <= value < 1 << 32:
            return UINT32
        if -(1 << 31) <= value < 0:
            return INT32
        return UINT64 if value > 0 else INT64
    if isinstance(value, float):
        return FLOAT32
    if isinstance(value, str):
        return STRING
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (list, tuple)):
            return (ARRAY, [_infer_type(v) for v in value])
        return (ARRAY, _infer_type(value[0]) if value else INT32)
    raise FormatError(f"cannot store a {type(value).__name__} in GGUF metadata")


def _pack_string(s):
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def _pack_value(key, value, desc):
    """Bytes of one value (without its type tag) for descriptor `desc`."""
    try:
        if isinstance(desc, int) and desc in _SCALAR:
            return struct.pack("<" + _SCALAR[desc], value)
        if desc == STRING:
            return _pack_string(value)
        kind, etype = desc
        if kind != ARRAY:
            raise ValueError
        if isinstance(etype, list):
            if len(etype) != len(value):
                raise ValueError
            return (_U32.pack(ARRAY) + _U64.pack(len(value))
                    + b"".join(_pack_value(key, v, t) for v, t in zip(value, etype)))
        head = _U32.pack(etype) + _U64.pack(len(value))
        if etype in _SCALAR:
            return head + struct.pack(f"<{len(value)}{_SCALAR[etype]}", *value)
        if etype == STRING:
            return head + b"".join(_pack_string(v) for v in value)
        raise ValueError
    except (struct.error, ValueError, TypeError, AttributeError):
        raise FormatError(f"GGUF metadata {key!r}: value {value!r:.80} does not fit type {desc!r}") from None


def _pack_tagged(key, value, desc):
    code = desc if isinstance(desc, int) else ARRAY
    return _U32.pack(code) + _pack_value(key, value, desc)


def write_gguf(path, tensors, metadata=None, metadata_types=None, alignment=None, version=3):
    """Write a GGUF file.
    tensors: name -> Tensor | numpy array | (dtype_name, shape, bytes) (shapes row-major;
             block dtypes such as "q4_k" take the blocks as bytes).
    metadata: key -> value (bool, int, float, str, or lists of them);
    metadata_types: key -> GGUF value type code (or (9, element code) for arrays), overriding
                    the inferred one (ints default to UINT32 / INT32 / 64-bit as they fit, floats to FLOAT32).
    alignment: tensor data alignment; defaults to metadata's general.alignment, else 32."""
    metadata = dict(metadata or {})
    types = dict(metadata_types or {})
    if alignment is None:
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise FormatError(f"{path}: GGUF alignment {alignment!r} is not a power of two")
    if alignment != DEFAULT_ALIGNMENT or "general.alignment" in metadata:
        metadata["general.alignment"] = alignment
        types.setdefault("general.alignment", UINT32)
    infos, parts, offset = [], [], 0
    for name, value in tensors.items():
        dtype, shape, data = tensor_parts(name, value)
        type_id = DTYPE_TO_GGML.get(dtype.name)
        if type_id is None:
            raise FormatError(f"{path}: tensor {name!r}: GGUF has no type for {dtype.name}")
        dims = list(reversed(shape)) or [1]  # ggml has no 0-d tensors
        infos.append(_pack_string(name) + _U32.pack(len(dims)) + b"".join(_U64.pack(d) for d in dims)
                     + _U32.pack(type_id) + _U64.pack(offset))
        parts.append(data)
        offset += -(-data.nbytes // alignment) * alignment
    head = [MAGIC, _U32.pack(version), _U64.pack(len(infos)), _U64.pack(len(metadata))]
    for key, value in metadata.items():
        head.append(_pack_string(key) + _pack_tagged(key, value, types[key] if key in types else _infer_type(value)))
    head += infos
    header = b"".join(head)
    with atomic_output(path) as f:  # a crash leaves no truncated file
        f.write(header)
        f.write(b"\0" * (-len(header) % alignment))
        for data in parts:
            f.write(data)
            f.write(b"\0" * (-data.nbytes % alignment))
