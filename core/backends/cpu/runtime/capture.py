"""Capture and replay on the numpy CPU device (tallow.capture), the same contract the GPU
backends keep: a decoding step's kernel calls are recorded once, with the arrays they read and
write, and a replay calls them again with no op front end, no layouts, no checks and no
allocation. On SmolLM2-135M Q4_1 that Python was about a quarter of a token (bench/llm_split.py).

What is recorded: the numba kernel calls of the CPU decode path (backend.py with the
kernels of quant/cpu_*.py loaded): the quantised embedding lookup, add_norm_linear, the
decoding-step quantised products and cache_attention, and add_rms_norm. Any other compute
primitive called inside a capture marks the recording as computed on the host (see
`guard_unrecorded`), so StepReplays never replays it: the step decodes eagerly, as before.

An entry is (fn, args): a replay calls fn(*args). The arrays in args are the ones the
captured step read and wrote (held by the recording, so they stay alive); the input ids are a
graph input's storage, which Graph.replay overwrites in place. What depends on the position
(cache_attention's cache slot, its key count and its rotary rows) reads the step buffer, a
4-word uint32 array (core/backends/step_buffer.py), when called. The signature is the kernel and
its scalar arguments and each array's dtype and shape, so two captures at two positions match
only when nothing but the step buffer depends on the position.
"""
import functools

import numpy as np

from ....errors import ShapeError


class CpuDriver:
    """The record/replay half of the driver protocol (core/backends/driver_protocol.py) for numpy.
    program(calls): the calls as one program that replays without Python between them
    (backends/cpu/kernels/step_loop.py), or None; replay then makes the calls one by one."""
    name = "cpu"
    can_replay = True

    def __init__(self, program):
        self.program = program

    @staticmethod
    def write(buf, byte_offset, data):
        buf.view(np.uint8)[byte_offset:byte_offset + len(data)] = np.frombuffer(data, np.uint8)

    def record(self, entries):
        # [program (made at the first replay: most first captures are only compared), calls]
        return [None, list(entries)]

    def replay(self, handle):
        if handle[0] is None:
            handle[0] = self.program(handle[1]) or False
        if handle[0]:
            handle[0].run()
            return
        for fn, args in handle[1]:
            fn(*args)


def entry_signature(entry):
    """The kernel, its scalar arguments and each array's dtype and shape (computed only when two
    captures are compared)."""
    fn, args = entry
    return (getattr(fn, "__name__", repr(fn)), _arg_signature(args))


def _arg_signature(a):
    if isinstance(a, np.ndarray):
        return ("array", a.dtype.str, a.shape)
    if isinstance(a, (tuple, list)):
        return tuple(_arg_signature(x) for x in a)
    if isinstance(a, (bool, int, float, str, np.generic)) or a is None:
        return (type(a).__name__, a)
    return (type(a).__name__,)  # a kernel, a pool: the same objects at every position


def entry(fn, *args):
    """A recording entry: fn(*args) at replay."""
    return (fn, args)


def step_new_buffer(words):
    return np.frombuffer(words, "<u4").copy()


class Recorder:
    """What the numpy backend hands its kernel paths while this thread captures: record(fn, *args)
    adds an entry; refuse(what) marks the step as not replayable (it decodes eagerly)."""

    def __init__(self, recording):
        self.recording = recording

    def __call__(self, fn, *args):
        self.recording.add(entry(fn, *args))

    def refuse(self, what):
        self.recording.computed_on_host(what)

    def bound(self, view, storage, what):
        """view, after refusing the step when view is a copy of storage rather than its memory."""
        if not np.may_share_memory(view, storage):  # (bounds only: a copy never overlaps, a view does)
            self.refuse(f"a copy of {what}")
        return view


# ---- entries whose arguments depend on the step ---------------------------------------------

def check_position(step, t, cap, rel, table_rows):
    """A replay at the step buffer's position must fit the KV cache (capacity cap) and, with
    rotary tables, their rows (rel: the captured rows' offset less their position)."""
    position = int(step[0])
    if position + t > cap:
        raise ShapeError(f"capture: replay at position {position} needs {position + t} cache slots, the cache "
                         f"has {cap}: grow the cache and capture again")
    if table_rows and position + rel + t > table_rows:
        raise ShapeError(f"capture: replay at position {position} passes the rotary tables' {table_rows} rows: "
                         "capture again")


def cache_attention(kernel, step, rel, q, k, v, cos_table, sin_table, kc, vc, key_start, scale, interleaved, out):
    """fused_ops.cache_attention at the step buffer's position: the rotary rows from
    position + rel of the whole tables (rel: the captured view's row offset less its position).
    key_start < 0 is a sliding window's -window: the keys from max(0, position + t - window)."""
    t = q.shape[2]
    check_position(step, t, kc.shape[2], rel, cos_table.shape[0])
    position = int(step[0])
    if key_start < 0:
        key_start = max(0, position + t + key_start)
    if cos_table.shape[0]:
        cos, sin = cos_table[position + rel:position + rel + t], sin_table[position + rel:position + rel + t]
    else:
        cos, sin = cos_table, sin_table
    kernel(q, k, v, cos, sin, kc, vc, position, key_start, scale, interleaved, out)


# ---- primitives that are not recorded --------------------------------------------------------

# Every compute primitive of the backend contract (core/backends/base.py). The ones the numpy
# backend records are wrapped by nothing; the others, called inside a capture, make the
# recording unreplayable. Reads (to_list, to_numpy, to_bytes) and new storages from host values
# (from_list, from_bytes: a graph input, a constant) are not compute and are not guarded, as on the
# GPU backends.
COMPUTE_PRIMITIVES = (
    "full", "arange", "copy", "assign", "cast", "unary", "binary", "compare", "where", "reduce", "cumsum",
    "matmul", "qmatmul", "dequantize", "index_select", "gather", "scatter_add", "conv1d", "conv2d", "softmax",
    "layer_norm", "rms_norm", "rope", "attention", "concat_rows", "add_rms_norm", "add_layer_norm",
    "matmul_bias", "qmatmul_bias", "gated_matmul", "gated_qmatmul", "add_norm_linear", "kv_write",
    "rope_kv_write", "cache_attention", "batch_cache_attention", "custom",
)


def guard_unrecorded(cls, recorded):
    """Wrap cls's compute primitives that are not in `recorded` so that, inside a capture in this
    thread, they mark the recording as computed on the host. A recorded primitive that falls back
    to base.py's composition reaches these guards through the primitives it composes."""
    for name in COMPUTE_PRIMITIVES:
        if name not in recorded:
            setattr(cls, name, _guarded(name, getattr(cls, name)))


def _guarded(name, eager):
    @functools.wraps(eager)  # (inspect.signature then shows the primitive's own parameters)
    def guarded(self, *args, **kwargs):
        if self._captures:
            rec = self._capture()
            if rec is not None:
                rec.computed_on_host(f"{name} (not recorded on the cpu device)")
        return eager(self, *args, **kwargs)
    return guarded
