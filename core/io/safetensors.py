"""safetensors: read (memory-mapped, validated, lazy) and write.

Layout: u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data; offsets are relative to the end of the header.
Sharded checkpoints are read through their model.safetensors.index.json.
"""
import json
import os
import struct

from ..dtypes import get_dtype
from ..errors import FormatError
from .atomic_output import atomic_output
from .lazy_file import LazyFile, TensorInfo, numel_of
from .tensor_parts import tensor_parts

# safetensors dtype name <-> tallow dtype name
TO_TALLOW = {"F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "I64": "i64", "I32": "i32",
             "I8": "i8", "U8": "u8", "U32": "u32", "BOOL": "bool"}
FROM_TALLOW = {v: k for k, v in TO_TALLOW.items()}
# dtypes the format has and tallow does not: still sized, so the file validates
_FOREIGN_ITEMSIZE = {"I16": 2, "U16": 2, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER = 100_000_000  # the safetensors library's own limit


class SafetensorsFile(LazyFile):
    format = "safetensors"

    def __init__(self, source):
        super().__init__(source)
        size = self.size
        if size < 8:
            self._fail(f"truncated: {size} bytes, not even the 8-byte header length")
        (n,) = struct.unpack_from("<Q", self._bytes(0, 8), 0)
        if n > MAX_HEADER:
            self._fail(f"header length {n} is larger than the {MAX_HEADER}-byte limit")
        if 8 + n > size:
            self._fail(f"header length {n} runs past the end of the {size}-byte file")
        try:
            header = json.loads(bytes(self._bytes(8, n)).decode("utf-8"))
        except UnicodeDecodeError as e:
            self._fail(f"header is not UTF-8 ({e.reason} at byte {8 + e.start})")
        except ValueError as e:
            self._fail(f"header is not valid JSON ({e})")
        if not isinstance(header, dict):
            self._fail("header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            self._fail("__metadata__ must map strings to strings")
        self.metadata = meta
        start = 8 + n
        for name, entry in header.items():
            self.infos[name] = self._parse_entry(name, entry, start, size)
        self._check_extents(start, size)
        self._check_coverage(start, size)

    def _check_coverage(self, start, size):
        """The safetensors library's rule: sorted by offset, the tensors tile the data section
        exactly, from its first byte to the end of the file. A header length that is off
        (N-1 still parses when the header ends in padding) then shows as bytes left over
        instead of as every weight shifted by one byte."""
        covered = 0
        for info in sorted(self.infos.values(), key=lambda i: (i.offset, i.nbytes)):
            if info.offset - start != covered:
                self._fail(f"data starts at {info.offset - start} of the data section, but the tensors before "
                           f"it end at {covered} (the offsets must be contiguous from 0)", info.name)
            covered += info.nbytes
        if start + covered != size:
            self._fail(f"the header length and the tensors' offsets account for {start + covered} bytes, the "
                       f"file has {size}: the header length or data_offsets are wrong (incomplete metadata)")

    def _parse_entry(self, name, entry, start, size):
        if not isinstance(entry, dict):
            self._fail("header entry is not an object", name)
        file_dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(file_dtype, str):
            self._fail(f"dtype {file_dtype!r} is not a string", name)
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            self._fail(f"shape {shape!r} is not a list of non-negative integers", name)
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            self._fail(f"data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end", name)
        begin, end = offsets
        if start + end > size:
            self._fail(f"data_offsets [{begin}, {end}] run past the end of the data ({size - start} bytes)", name)
        dtype, problem = None, None
        if file_dtype in TO_TALLOW:
            dtype = get_dtype(TO_TALLOW[file_dtype])
            itemsize = dtype.itemsize
        elif file_dtype in _FOREIGN_ITEMSIZE:
            itemsize = _FOREIGN_ITEMSIZE[file_dtype]
            problem = f"dtype {file_dtype} is not supported by tallow (supported: {', '.join(TO_TALLOW)})"
        else:
            self._fail(f"unknown dtype {file_dtype!r}", name)
        expected = numel_of(shape) * itemsize
        if expected != end - begin:
            self._fail(f"shape {shape} of {file_dtype} needs {expected} bytes "
                       f"but data_offsets span {end - begin}", name)
        return TensorInfo(name, dtype, file_dtype, shape, end - begin, start + begin, problem)


class ShardedSafetensors(LazyFile):
    """A checkpoint split over several files, listed by model.safetensors.index.json.
    Shards are opened (mapped) on first use."""
    format = "safetensors (sharded)"

    def __init__(self, index_path, open_shard=None):
        """open_shard(file name) -> a reader: how shards are opened (default: the file next to the
        index; in the browser, files picked from disk and read in slices)."""
        index_path = os.fspath(index_path)
        self._open_shard = open_shard
        super().__init__(index_path)
        try:
            index = json.loads(bytes(self.data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            self._fail(f"not a valid JSON index ({e})")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            self._fail("index has no weight_map of tensor name -> shard file")
        self.metadata = index.get("metadata") or {}
        self.data = memoryview(b"")
        self._dir = os.path.dirname(index_path)
        self._shard_of = {}
        self._shards = {}
        for name, shard in weight_map.items():
            if os.path.basename(shard) != shard:
                self._fail(f"shard file {shard!r} must be a plain file name next to the index", name)
            self._shard_of[name] = shard

    def _shard(self, name):
        if name not in self._shard_of:
            raise FormatError(f"{self.path}: no tensor named {name!r}")
        shard = self._shard_of[name]
        if shard not in self._shards:
            self._shards[shard] = (self._open_shard(shard) if self._open_shard is not None
                                   else SafetensorsFile(os.path.join(self._dir, shard)))
        f = self._shards[shard]
        if name not in f.infos:
            raise FormatError(f"{self.path}: tensor {name!r} is listed in shard {shard} "
                              "but that file does not contain it")
        return f

    def keys(self):
        return list(self._shard_of)

    def __iter__(self):
        return iter(self._shard_of)

    def __len__(self):
        return len(self._shard_of)

    def __contains__(self, name):
        return name in self._shard_of

    def info(self, name):
        return self._shard(name).info(name)

    def raw(self, name):
        return self._shard(name).raw(name)

    def tensor(self, name, device=None):
        return self._shard(name).tensor(name, device)

    def close(self):
        for f in self._shards.values():
            f.close()
        self._shards.clear()


def write_safetensors(path, tensors, metadata=None):
    """Write `tensors` (name -> Tensor | numpy array | (dtype_name, shape, bytes)) to `path`.
    metadata: optional dict of str -> str, stored as __metadata__."""
    header, parts, offset = {}, [], 0
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise FormatError(f"{path}: safetensors metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    for name, value in tensors.items():
        dtype, shape, data = tensor_parts(name, value)
        if dtype.name not in FROM_TALLOW:
            raise FormatError(f"{path}: tensor {name!r}: safetensors cannot store {dtype.name} "
                              "(quantised blocks go in GGUF)")
        header[name] = {"dtype": FROM_TALLOW[dtype.name], "shape": list(shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        parts.append(data)
        offset += data.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the library writes it
    with atomic_output(path) as f:  # a crash leaves no truncated file
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for data in parts:
            f.write(data)
