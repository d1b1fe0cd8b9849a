"""What the wasm device's two drivers share (driver_native.WasmtimeDriver under wasmtime,
driver_browser.BrowserWasmDriver in Pyodide over js/driver.js): the driver protocol's wasm-call
form over a memory they reach through four hooks (_alloc_range, _read, _write, _call).

Buffers are byte ranges of kernels.wasm's memory; a launch calls one export with addresses and
counts; record() writes a step's launches as one program into the memory (program.py), and
replay() is one call of `run`: a decode step costs the host one call.

    x = driver.alloc(f32, 576)                     # zeroed
    driver.launch("silu", [x, 576, y])             # buffers stand for their address
    handle = driver.record([("call", "copy_f32", [x, 64, StepArg(cache, 256)])])
    driver.write(driver.step, 0, step_words(position, token)); driver.replay(handle)

An argument is a buffer (its address), (buffer, byte offset), an int, a float (float kernel
parameters), or a StepArg whose base may be any of the first three. WasmBackend uses these
natively (backend.py, a GpuBackend; docs/wasm.md).
Standard library only.
"""
import weakref
from bisect import bisect_left, bisect_right, insort

from ...errors import DeviceError, ShapeError, UnsupportedError
from ..driver_protocol import nbytes_of
from .program import StepArg, encode

MEMORY_LIMIT = 1 << 32  # wasm32 addresses
ALIGN = 16  # every buffer starts on a SIMD128 boundary (as the memory hooks align)

# What the device's memory holds per byte of a model's weights file, measured (docs/wasm.md "Memory"):
# the weights once (about 1.0x: the tensors are the file less its header), plus the KV cache,
# activations, recorded steps and scratch of a chat, SmolLM2-135M's 0.14x after a 37-token prompt
# and 16 tokens. A model whose file times this passes wasm32's 4 GiB cannot run on the device.
MEMORY_PER_FILE_BYTE = 1.2


def too_large(file_bytes, name="this model"):
    """None when a model whose files hold file_bytes can fit the wasm device's memory, else the
    message that refuses it (the page shows it before downloading anything)."""
    file_bytes = int(file_bytes)
    if file_bytes * MEMORY_PER_FILE_BYTE <= MEMORY_LIMIT:
        return None
    return (f"{name} ({file_bytes / 1e9:.2f} GB) is too large for this browser's WebAssembly device: its weights "
            f"plus KV cache and activations need about {file_bytes * MEMORY_PER_FILE_BYTE / 1e9:.1f} GB, and "
            f"wasm32's memory holds at most 4 GiB ({MEMORY_LIMIT / 1e9:.2f} GB). Pick a smaller quantisation "
            f"or a smaller model (files up to {MEMORY_LIMIT / MEMORY_PER_FILE_BYTE / 1e9:.1f} GB fit), or use a "
            "browser with WebGPU (recent Chrome or Edge with a GPU), which keeps the weights in GPU memory.")


class WasmBuffer:
    """nbytes of the module's memory at byte address `at`; its range goes back to the driver's free
    ranges (reused by later allocs of any size that fits) when it is dropped."""
    __slots__ = ("at", "nbytes", "__weakref__")

    def __init__(self, at, nbytes):
        self.at, self.nbytes = at, nbytes

    def __repr__(self):
        return f"WasmBuffer(at={self.at}, {self.nbytes} bytes)"


class _Program:
    """A recorded step: its words in the memory, its call count, and every buffer it names."""
    __slots__ = ("words", "count", "keep")

    def __init__(self, words, count, keep):
        self.words, self.count, self.keep = words, count, keep


class WasmDriver:
    """The wasm-call form over the hooks a subclass gives: _alloc_range(nbytes) (fresh zeroed
    bytes at the memory's top, 16-aligned: their address), _read(at, nbytes), _write(at, data),
    _call(export, args), _memory_bytes(); and its `table`, the address of the f16 table the block
    kernels take."""
    can_replay = True

    def _start(self):
        # Free ranges of the memory, coalesced, reused best-fit (the memory itself never shrinks:
        # WebAssembly.Memory cannot). A dropped buffer's range goes on `_pending` (what a weakref
        # finalizer may do at any moment) and is merged into the ranges at the next alloc.
        self._pending = []
        self._free_at = {}  # start -> length of each free range
        self._starts = []  # their starts, sorted
        self._by_size = {}  # length -> starts of free ranges of that length
        self._sizes = []  # the lengths in _by_size, sorted
        self._top = None  # the end of the last range _alloc_range gave (a free range ending there can grow)
        self.free_bytes = 0  # bytes in free ranges (after the pending ones are merged)
        self.step = self.alloc_bytes(8)  # the step words a recorded program's StepArgs read

    # ---- memory -----------------------------------------------------------------------
    def alloc(self, dtype, numel):
        return self.alloc_bytes(nbytes_of(dtype, numel))

    def alloc_bytes(self, nbytes):
        """A zeroed buffer of nbytes (at least 1, so every buffer has its own address): a free range
        of the memory (the smallest that fits, its rest kept free), else fresh memory at the top."""
        nbytes = max(int(nbytes), 1)
        if nbytes > MEMORY_LIMIT:
            raise DeviceError(f"the wasm device cannot hold a {nbytes}-byte buffer: wasm32's memory is at most "
                              f"{MEMORY_LIMIT >> 30} GiB (weights, caches and activations together)")
        size = -(-nbytes // ALIGN) * ALIGN
        self._merge_pending()
        at = self._take(size)
        if at is None:
            at = self._extend(size)
        else:
            self._zero(at, nbytes)
        buf = WasmBuffer(at, nbytes)
        weakref.finalize(buf, self._pending.append, (at, size))
        return buf

    def memory_bytes(self):
        """The size of the module's memory now (it only grows)."""
        return self._memory_bytes()

    def _take(self, size):
        i = bisect_left(self._sizes, size)
        if i == len(self._sizes):
            return None
        have = self._sizes[i]
        at = self._by_size[have][-1]
        self._unlink(at)
        if have > size:
            self._link(at + size, have - size)
        return at

    def _extend(self, size):
        """size bytes at the top: a free range that ends there grows into fresh memory."""
        tail = self._starts[-1] if self._starts else None
        if tail is not None and tail + self._free_at[tail] == self._top:
            more = size - self._free_at[tail]
            got = self._alloc_range(more)
            if got == self._top:
                self._unlink(tail)
                self._zero(tail, self._top - tail)
                self._top = got + more
                return tail
            self._link(got, more)  # the memory's top moved under us: keep that range, start afresh
        at = self._alloc_range(size)
        self._top = at + size
        return at

    def _link(self, at, size):
        self._free_at[at] = size
        insort(self._starts, at)
        same = self._by_size.get(size)
        if same is None:
            self._by_size[size] = [at]
            insort(self._sizes, size)
        else:
            same.append(at)
        self.free_bytes += size

    def _unlink(self, at):
        size = self._free_at.pop(at)
        del self._starts[bisect_left(self._starts, at)]
        same = self._by_size[size]
        same.remove(at)
        if not same:
            del self._by_size[size]
            del self._sizes[bisect_left(self._sizes, size)]
        self.free_bytes -= size
        return size

    def _merge_pending(self):
        """Dropped buffers' ranges into the free ranges, each joined with free neighbours."""
        pending = self._pending
        while pending:
            at, size = pending.pop()
            after = self._free_at.get(at + size)
            if after is not None:
                self._unlink(at + size)
                size += after
            i = bisect_right(self._starts, at) - 1
            if i >= 0:
                before = self._starts[i]
                if before + self._free_at[before] == at:
                    size += self._unlink(before)
                    at = before
            self._link(at, size)

    def _zero(self, at, nbytes):
        """Zero a reused range (BrowserWasmDriver does it in JS, not through Python bytes)."""
        self._write(at, bytes(nbytes))

    def _range(self, buf, byte_offset, nbytes, what):
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > buf.nbytes:
            raise ShapeError(f"wasm {what}: bytes [{byte_offset}, {byte_offset + nbytes}) outside a "
                             f"{buf.nbytes}-byte buffer")
        return buf.at + byte_offset

    def download(self, buf, byte_offset, nbytes):
        at = self._range(buf, byte_offset, nbytes, "download")
        return self._read(at, nbytes)

    def write(self, buf, byte_offset, data):
        data = bytes(data)
        self._write(self._range(buf, byte_offset, len(data), "write"), data)

    def upload(self, data, dtype):
        data = bytes(data)
        buf = self.alloc_bytes(len(data))
        self.write(buf, 0, data)
        return buf

    # ---- launching --------------------------------------------------------------------
    @staticmethod
    def _address(value, keep):
        if isinstance(value, WasmBuffer):
            keep.append(value)
            return value.at
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], WasmBuffer):
            keep.append(value[0])
            return value[0].at + value[1]
        return value

    def _resolved(self, kernel, args, keep):
        out = []
        for value in args:
            if isinstance(value, StepArg):
                out.append(StepArg(self._address(value.base, keep), value.stride, value.slot))
            else:
                out.append(self._address(value, keep))
        encode([(kernel, out)])  # refuses an unknown kernel or a wrong argument count, by name
        return out

    def launch(self, kernel, args):
        """Call export `kernel` now; a StepArg takes the step words as they are."""
        try:
            args = self._resolved(kernel, args, [])
        except UnsupportedError as e:
            raise UnsupportedError(f"the wasm device cannot launch it: {e}") from None
        if any(isinstance(a, StepArg) for a in args):
            words = memoryview(self.download(self.step, 0, 8)).cast("i")
            slots = {"position": words[0], "token": words[1]}
            args = [a.base + a.stride * slots[a.slot] if isinstance(a, StepArg) else a for a in args]
        self._call(kernel, args)

    # ---- capture and replay -------------------------------------------------------------
    def record(self, entries):
        """One program for a step's ("call", kernel, args) entries, written into the memory once."""
        keep, calls = [], []
        for entry in entries:
            if entry[0] != "call":
                raise UnsupportedError(f"the wasm device records kernel calls only, not {entry[0]!r} entries")
            calls.append((entry[1], self._resolved(entry[1], entry[2], keep)))
        words, count = encode(calls)
        program = self.upload(words.tobytes(), None)
        return _Program(program, count, keep)

    def replay(self, handle):
        """The recorded step again (its step words already written): one call of `run`."""
        self._call("run", [handle.words.at, handle.count, self.step.at])
