"""Weight files, read lazily: safetensors (also sharded), GGUF, npz.

    f = tallow.io.open("model.gguf")       # maps the file; parses and validates the header only
    f.keys(); f.metadata; f.info(name)     # TensorInfo: dtype, shape, nbytes, offset
    f.raw(name)                            # memoryview of the stored bytes (no copy)
    f.tensor(name, device="cpu")           # a tallow Tensor over those bytes

    tallow.io.load_file(path, device=None) -> {name: Tensor}
    tallow.io.save_file({name: Tensor}, path, metadata=None)   # .safetensors or .gguf

Low-level writers (also take numpy arrays or (dtype_name, shape, bytes)):
write_safetensors(path, tensors, metadata) and
write_gguf(path, tensors, metadata, metadata_types, alignment).
"""
import os

from ..errors import FormatError
from .. import quant as _quant  # noqa: F401  (registers the block dtypes GGUF files use)
from .byte_source import ByteSource, BytesSource, JsArrayBufferSource, JsSlicedSource, is_byte_source
from .gguf import GGUFFile, write_gguf
from .lazy_file import LazyFile, TensorInfo
from .npz import NpzFile
from .safetensors import SafetensorsFile, ShardedSafetensors, write_safetensors

__all__ = ["open", "load_file", "save_file", "GGUFFile", "SafetensorsFile", "ShardedSafetensors", "NpzFile",
           "LazyFile", "TensorInfo", "write_gguf", "write_safetensors", "ByteSource", "BytesSource",
           "JsArrayBufferSource", "JsSlicedSource"]

_INDEX = "model.safetensors.index.json"


def open(source, format=None):
    """A lazy reader for a weights file (path, directory, a bytes-like buffer, or a ByteSource
    such as JsArrayBufferSource: the header is read, tensors are copied when asked).
    The format comes from `format` ("safetensors", "gguf", "npz"), else the file's
    first bytes, else its extension. A directory opens its model.safetensors(.index.json)."""
    if not isinstance(source, (bytes, bytearray, memoryview)) and not is_byte_source(source):
        source = os.fspath(source)
        if os.path.isdir(source):
            for name in (_INDEX, "model.safetensors"):
                if os.path.exists(os.path.join(source, name)):
                    source = os.path.join(source, name)
                    break
            else:
                raise FormatError(f"{source}: directory has neither {_INDEX} nor model.safetensors")
        if source.endswith(".index.json"):
            return ShardedSafetensors(source)
    format = format or _sniff(source)
    readers = {"safetensors": SafetensorsFile, "gguf": GGUFFile, "npz": NpzFile}
    if format not in readers:
        raise FormatError(f"{_label(source)}: unknown weights format {format!r} (known: {', '.join(readers)})")
    return readers[format](source)


def _label(source):
    if is_byte_source(source):
        return source.name
    return source if isinstance(source, str) else "<buffer>"


def _sniff(source):
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(memoryview(source)[:4])
    elif is_byte_source(source):
        head = source.read(0, min(4, source.size))
    else:
        try:
            with _builtin_open(source) as f:
                head = f.read(4)
        except OSError as e:
            raise FormatError(f"{source}: cannot open: {e.strerror or e}") from None
    if head == b"GGUF":
        return "gguf"
    if head[:2] == b"PK":
        return "npz"
    name = source.name if is_byte_source(source) else source
    if isinstance(name, str):
        for ext, fmt in ((".gguf", "gguf"), (".npz", "npz"), (".safetensors", "safetensors")):
            if name.endswith(ext):
                return fmt
    return "safetensors"  # starts with a length, not a magic number


def _builtin_open(path):
    import builtins
    return builtins.open(path, "rb")


def load_file(path, device=None):
    """{name: Tensor} for every tensor in the file (over the mapped bytes where the device allows)."""
    f = open(path)
    return {name: f.tensor(name, device) for name in f.keys()}


def save_file(tensors, path, metadata=None):
    """Write tensors (name -> Tensor, numpy array or (dtype_name, shape, bytes)) to a
    .safetensors or .gguf file, chosen by the extension."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        return write_safetensors(path, tensors, metadata)
    if path.endswith(".gguf"):
        return write_gguf(path, tensors, metadata)
    raise FormatError(f"{path}: save_file writes .safetensors or .gguf files, "
                      f"not {os.path.splitext(path)[1] or 'no extension'}")
