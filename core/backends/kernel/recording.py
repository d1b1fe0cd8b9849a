"""One captured step on a kernel backend (CUDA, Metal, their emulators; tallow.capture): what it
launched, in order, holding every buffer the launches bind so none is freed or reused.

Entries are ("launch", module, kernel, grid, block, args) -- what driver.launch takes -- or
("call", fn, signature): a host-side op that writes into buffers the step owns (the dense
matmul of the CUDA backend, cuBLAS, and of the emulators, numpy), run again by calling fn.

The values that change per step live in a 16-byte *step buffer* (int32: position of the
step's first new token, key count after it, 0, 0). The kernels that depend on them
(rope_kv_write and kv_write's cache slots and rotary rows, attention_step's key count over
the KV cache the step wrote) read it, so the launches are the same at every position.
replay() writes the step buffer and hands the prepared list to the driver: the emulators
launch it again (relaunch below), CuPy launches the CUDA graph it built from it, Metal
encodes it into one command buffer.
"""
from tallow.errors import UnsupportedError

from ..step_buffer import step_words  # the kernels read it as int32 x 4


def _arg_signature(a):
    if isinstance(a, (int, float, tuple)):  # host.I32 ... F64 scalars and Meta arrays: their values
        return (type(a).__name__, a)
    return ("buffer", a.dtype.name, a.numel)  # a DeviceStorage: buffers made in the step differ, sizes must not


class KernelRecording:
    def __init__(self, step, position, tokens):
        self.step, self.position, self.tokens = step, position, tokens
        self.entries = []
        self.cache_bufs = set()  # ids of the KV-cache storages this step wrote (rope_kv_write, kv_write)
        self.host_computed = []  # what the step computed on the host from its own data (see computed_on_host)
        self.handle = None       # the driver's prepared form, after finish()

    def launch(self, module, kernel, grid, block, args):
        self.entries.append(("launch", module, kernel, tuple(grid), tuple(block), list(args)))

    def call(self, fn, signature):
        self.entries.append(("call", fn, signature))

    def computed_on_host(self, what):
        """The step computed `what` on the host from data it made (a host dequantisation of rows
        looked up by ids): a replay would repeat stale bytes, so this recording matches no other
        (StepReplays then decodes eagerly) and refuses a replay."""
        self.host_computed.append(what)

    def finish(self, driver):
        self.handle = driver.record(self.entries)
        return self

    def signature(self):
        """What must match for two recordings to be the same step at two positions: kernels,
        grids, scalar and meta arguments, buffer sizes, host calls."""
        out = []
        for e in self.entries:
            if e[0] == "launch":
                _, module, kernel, grid, block, args = e
                out.append((module, kernel, grid, block, tuple(_arg_signature(a) for a in args)))
            else:
                out.append(("call", e[2]))
        return out + [("computed on the host", what, id(self)) for what in self.host_computed]

    def replay(self, driver, position, tokens):
        if self.host_computed:
            raise UnsupportedError(f"capture: the step computed {self.host_computed[0]} from its own data, which "
                                   f"a replay cannot redo; run it eagerly")
        driver.write(self.step, 0, step_words(position, tokens))
        driver.replay(self.handle)


def relaunch(driver, entries):
    """Run recorded entries again in order through the driver protocol (the emulators' replay)."""
    for e in entries:
        if e[0] == "launch":
            driver.launch(*e[1:])
        else:
            e[1]()
