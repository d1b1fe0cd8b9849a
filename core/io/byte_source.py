"""Byte-range sources for the weights readers: a file needs not be in memory.

A reader over a source parses its header from `read(0, n)` and copies each
tensor's bytes only when asked. In the browser the source is the fetched JS
ArrayBuffer: a device whose backend's `from_js_buffer` takes it (WebGPU over the
browser driver) copies a tensor's byte range from it straight into a GPU
buffer in JS, so the weights never enter the WebAssembly heap and a model
larger than that heap loads. Other devices get the bytes through `read()`.

    src = JsArrayBufferSource(array_buffer, "model.gguf")   # in Pyodide
    src = JsSlicedSource(sliced_file, "phi3.gguf")          # a Blob read in slices (files over 2 GB)
    f = tallow.io.open(src)                                 # header only
    f.tensor("token_embd.weight", device="wgpu")            # JS -> GPU copy
"""
from ..errors import FormatError


class ByteSource:
    """What a reader needs from a source: `size`, `name` (for messages) and `read(offset, size) -> bytes`.
    `bytes_read` counts what went through read(), i.e. into Python memory."""
    name = "<source>"
    size = 0
    js_buffer = None  # a JS ArrayBuffer when the bytes live in JS memory ...
    js_offset = 0  # ... starting at this byte of it

    def __init__(self):
        self.bytes_read = 0

    def read(self, offset, size):
        if offset < 0 or size < 0 or offset + size > self.size:
            raise FormatError(f"{self.name}: bytes [{offset}, {offset + size}) lie outside the {self.size}-byte file")
        self.bytes_read += size
        return self._read(offset, size)

    def _read(self, offset, size):
        raise NotImplementedError

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}, {self.size} bytes>"


class BytesSource(ByteSource):
    """Bytes already in Python memory (tests; and the reference for the other sources)."""

    def __init__(self, data, name="<buffer>"):
        super().__init__()
        self.data = memoryview(data).cast("B")
        self.size, self.name = len(self.data), name

    def _read(self, offset, size):
        return bytes(self.data[offset:offset + size])


class JsArrayBufferSource(ByteSource):
    """A JS ArrayBuffer, or a Uint8Array view of one (Pyodide JsProxies, e.g. from
    `await response.arrayBuffer()`); only the ranges read() asks for enter the wasm heap."""

    def __init__(self, js_bytes, name="<ArrayBuffer>"):
        super().__init__()
        import js  # Pyodide only
        if not hasattr(js_bytes, "byteLength"):
            raise FormatError(f"{name}: expected a JS ArrayBuffer or Uint8Array, got {type(js_bytes).__name__}")
        self._Uint8Array = js.Uint8Array
        view_of = getattr(js_bytes, "buffer", None)  # typed arrays have one, ArrayBuffers do not
        self.js_buffer = view_of if view_of is not None else js_bytes
        self.js_offset = int(js_bytes.byteOffset) if view_of is not None else 0
        self.size, self.name = int(js_bytes.byteLength), name

    def _read(self, offset, size):
        if size == 0:
            return b""
        return self._Uint8Array.new(self.js_buffer, self.js_offset + offset, size).to_bytes()


class JsSlicedSource(ByteSource):
    """A file too big for one JS ArrayBuffer (over 2 GB): a JS object with `size` and an async
    `read(offset, size) -> Uint8Array` that reads a Blob (a picked File, or a Cache API
    response's blob) slice by slice (web/src/worker.mjs's SlicedFile). read() waits for it
    through run_sync (Python entered with callPromising); a WebGPU device copies each tensor from
    it to the GPU in slices, in JS."""

    def __init__(self, js_file, name="<file>"):
        super().__init__()
        import pyodide.ffi as ffi  # Pyodide only
        if not (hasattr(js_file, "read") and hasattr(js_file, "size")):
            raise FormatError(f"{name}: expected a sliced JS file (size, read), got {type(js_file).__name__}")
        if not ffi.can_run_sync():
            raise FormatError(f"{name}: reading a sliced file needs Python entered through callPromising (JSPI)")
        self._run_sync = ffi.run_sync
        self.js_buffer = js_file
        self.size, self.name = int(js_file.size), name

    def _read(self, offset, size):
        if size == 0:
            return b""
        return self._run_sync(self.js_buffer.read(offset, size)).to_bytes()


def is_byte_source(obj):
    return isinstance(obj, ByteSource)


def direct_tensor(source, info, device):
    """A tensor copied from the source's JS buffer straight to the device, or None when the
    device's backend cannot take it that way (then the caller reads the bytes through read())."""
    if source.js_buffer is None:
        return None
    from ..creation import _device, _make
    dev = _device(device)
    storage = dev.backend.from_js_buffer(source.js_buffer, source.js_offset + info.offset, info.nbytes, info.dtype)
    if storage is None:
        return None
    return _make(storage, info.shape, info.dtype, dev)
