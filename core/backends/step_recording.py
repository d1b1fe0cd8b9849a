"""One captured step on a GPU backend (tallow.capture), the same class for every one of them:
wgpu, and CUDA/Metal through the kernel backend. It holds what the step launched, in order,
and keeps alive every storage those launches bind, so none is freed or reused by a later op.

An entry is whatever the backend's driver records: on the kernel backend ("launch", module,
kernel, grid, block, args) or ("call", fn, signature) (kernel/recording.py); on wgpu
(pipeline, bindings, params, workgroups) (wgpu_backend/recording.py). The recording never looks
inside one except through the backend's `entry_signature`, so the driver protocol's
record(entries) / replay(handle) pair (core/backends/driver_protocol.py) is all it needs.

The values that change per step live in the 16-byte *step buffer* (step_buffer.py): the
position of the step's first new token and the key count after it. The kernels that depend on
them read it, so the entries are the same at every position; replay() writes the step buffer
and hands the prepared entries to the driver.
"""
import threading

from tallow.errors import UnsupportedError

from .step_buffer import step_words


class StepRecording:
    def __init__(self, step, position, tokens, entry_signature):
        """step: the driver's step buffer (already holding step_words(position, tokens));
        entry_signature(entry): what must match for two entries to be the same launch."""
        self.step, self.position, self.tokens = step, position, tokens
        self.entry_signature = entry_signature
        self.entries = []
        self.keep = []           # storages the entries bind, held so the backend never reuses them
        self.cache_bufs = set()  # ids of the KV-cache buffers the step wrote (cache_attention, rope_kv_write ...)
        self.host_computed = []  # what the step computed on the host from its own data (computed_on_host)
        self.handle = None       # the driver's prepared form, after finish()

    def add(self, entry, keep=()):
        self.entries.append(entry)
        self.keep.extend(keep)

    def computed_on_host(self, what):
        """The step computed `what` on the host from data it made (say, rows looked up by ids
        the step computed): a replay would repeat stale bytes, so this recording matches no
        other (StepReplays then decodes eagerly) and refuses a replay."""
        self.host_computed.append(what)

    def finish(self, driver):
        self.handle = driver.record(self.entries)
        return self

    def signature(self):
        """What must match for two recordings to be the same step at two positions: each entry's
        signature (kernels, grids or workgroups, parameters, buffer sizes or binding ranges:
        buffers made in the step differ, of course), and no host-computed data."""
        sign = self.entry_signature
        return [sign(e) for e in self.entries] + [("computed on the host", what, id(self))
                                                  for what in self.host_computed]

    def replay(self, driver, position, tokens):
        if self.host_computed:
            raise UnsupportedError(f"capture: the step computed {self.host_computed[0]} from its own data, which "
                                   f"a replay cannot redo; run it eagerly")
        driver.write(self.step, 0, step_words(position, tokens))
        driver.replay(self.handle)


class StepCapture:
    """The capture half of the backend contract, shared by every GPU backend: one open
    StepRecording per thread (another thread's ops on the device run eagerly and stay out of
    it). A backend sets `_captures = {}` in __init__ and provides `entry_signature(entry)`
    and `_new_step_buffer(words)` (its driver's step buffer holding these bytes)."""

    def _capture(self):
        """The recording this thread is capturing into, or None."""
        return self._captures.get(threading.get_ident()) if self._captures else None

    def can_capture(self):
        return self.driver.can_replay

    def begin_capture(self, position, tokens):
        if not self.can_capture():
            return super().begin_capture(position, tokens)
        me = threading.get_ident()
        if me in self._captures:
            raise UnsupportedError(f"{self.name}: a capture is already in progress in this thread "
                                   "(captures do not nest)")
        step = self._new_step_buffer(step_words(position, tokens))
        self._captures[me] = StepRecording(step, position, tokens, self.entry_signature)

    def end_capture(self):
        rec = self._captures.pop(threading.get_ident(), None)
        if rec is None:
            raise UnsupportedError(f"{self.name}: end_capture without begin_capture")
        return rec.finish(self.driver)

    def replay(self, recording, position, tokens):
        recording.replay(self.driver, position, tokens)
