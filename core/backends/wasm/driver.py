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

from ...errors import DeviceError, ShapeError, UnsupportedError
from ..driver_protocol import nbytes_of
from .program import StepArg, encode

MEMORY_LIMIT = 1 << 32  # wasm32 addresses

class WasmBuffer:
    """nbytes of the module's memory at byte address `at`; its range goes back to the driver
    (for reuse by a later alloc of the same size) when it is dropped."""
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
    bytes: their address), _read(at, nbytes), _write(at, data), _call(export, args); and its
    `table`, the address of the f16 table the block kernels take."""
    can_replay = True

    def _start(self):
        self._free = {}  # nbytes -> addresses of dropped buffers of that size
        self.step = self.alloc_bytes(8)  # the step words a recorded program's StepArgs read

    # ---- memory -----------------------------------------------------------------------
    def alloc(self, dtype, numel):
        return self.alloc_bytes(nbytes_of(dtype, numel))

    def alloc_bytes(self, nbytes):
        """A zeroed buffer of nbytes (at least 1, so every buffer has its own address)."""
        nbytes = max(int(nbytes), 1)
        if nbytes > MEMORY_LIMIT:
            raise DeviceError(f"the wasm device cannot hold a {nbytes}-byte buffer: wasm32's memory is at most "
                              f"{MEMORY_LIMIT >> 30} GiB (weights, caches and activations together)")
        reuse = self._free.get(nbytes)
        if reuse:
            at = reuse.pop()
            self._zero(at, nbytes)
        else:
            at = self._alloc_range(nbytes)
        buf = WasmBuffer(at, nbytes)
        weakref.finalize(buf, self._free.setdefault(nbytes, []).append, at)
        return buf

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
