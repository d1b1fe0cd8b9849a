"""Capture and replay: record one decode step's GPU launches once, then replay them with no
Python per op (no op front end, no layouts, no kernel choice).

    with tallow.capture(device, position=cache.length) as graph:
        ids = graph.input([[token]])                     # a fixed input replay() rewrites
        graph.output(model(ids, cache=cache, last_only=True))
    # ... later, with the cache one position further:
    logits, = graph.replay([[next_token]], position=cache.length)

Inside the block the ops run as usual (the step computes its real result) while the backend
records every launch. replay() writes the new input values and a small step buffer
(position, position + tokens), launches the recorded list, and returns copies of the
outputs (fresh tensors: a result you keep is never overwritten by the next replay).

What a replay may change is only what the kernels read from those buffers:
  - the inputs made with graph.input (same shape and dtype);
  - the position: inside a capture functional.cache_attention, functional.rope_kv_write and
    functional.kv_write write the KV-cache slots (and the rotary ones read the rotary rows)
    *at the step's position* (cache_attention attends over the keys up to it; its split-K workgroups are
    fixed by the cache's capacity),
    and attention over a KV cache written in the step reads its key count (position +
    tokens) from the step buffer, so its workgroup count never depends on the cache length.
Everything else is frozen: shapes, weights, the KV cache's buffers (a cache that grows gets
new buffers: capture again), and Python state the step changed (the caller advances its
cache lengths itself). same_launches() compares two captures taken at different positions:
when they match, nothing else in the step depended on the position, which is how
StepReplays (below) checks a step before it replays it, for CausalLM's one-token steps and
Whisper's decoder steps (models/causal_lm.py, models/whisper.py).
(The module is tallow.step_capture; `tallow.capture` is the function.)

Backends: wgpu with its native, browser or do-nothing driver, and CUDA and Metal through the
kernel backend they share; all of them record into one class, tallow/backends/step_recording.py
(native wgpu re-encodes the list, the browser replays it in one JS call, CuPy replays a CUDA
graph, Metal encodes the list into one command buffer, the CPU emulators launch it again),
and the numpy cpu device once its numba kernels are in use (core/backends/cpu/runtime/capture.py: the
step's kernel calls, replayed as one numba program per thread, backends/cpu/kernels/step_loop.py).
Elsewhere can_capture(device) is False and tallow.capture raises UnsupportedError; callers fall
back to eager.
"""
import struct
from typing import Any

from .creation import tensor
from .device import Device, default_device
from .errors import DTypeError, Error, ShapeError, UnsupportedError
from .layout import Layout
from .nested import flatten_nested
from .tensor import Tensor

# The dtypes a graph input may have, as struct formats of the bytes replay() writes.
_INPUT_FORMATS = {"i64": "q", "i32": "i", "u32": "I", "f32": "f"}


def _device(device):
    return default_device() if device is None else Device(device)


def can_capture(device=None):
    """Whether tallow.capture works on this device."""
    return _device(device).backend.can_capture()


class Graph:
    """One captured step: its recording, its inputs and its outputs."""

    def __init__(self, device: Device, position: int, tokens: int):
        if position < 0 or tokens < 1:
            raise Error(f"capture: position must be >= 0 and tokens >= 1, got {position} and {tokens}")
        self.device, self.position, self.tokens = device, position, tokens
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.recording: Any = None  # the backend's recording, after the block
        self._open = False

    def __enter__(self):
        self.device.backend.begin_capture(self.position, self.tokens)
        self._open = True
        return self

    def __exit__(self, *exc):
        self._open = False
        recording = self.device.backend.end_capture()
        if exc[0] is None:
            self.recording = recording
        return False

    def input(self, data, dtype=None) -> Tensor:
        """A tensor of data on the device whose values replay() rewrites (a token id)."""
        if not self._open:
            raise Error("capture: graph.input must be made inside the `with tallow.capture(...)` block")
        t = tensor(data, dtype, self.device)
        if t.dtype.name not in _INPUT_FORMATS:
            raise DTypeError(f"capture: a graph input must be {', '.join(_INPUT_FORMATS)}, got {t.dtype.name}")
        self.inputs.append(t)
        return t

    def output(self, t: Tensor) -> Tensor:
        """Mark t as a result replay() returns (a copy each time); returns t."""
        if not self._open:
            raise Error("capture: graph.output must be marked inside the `with tallow.capture(...)` block")
        if t.device is not self.device:
            raise Error(f"capture: output on {t.device}, the graph captures {self.device}")
        self.outputs.append(t)
        return t

    def same_launches(self, other: "Graph") -> bool:
        """Whether other recorded the same launches (kernels, parameters, workgroups, binding
        ranges): true for two positions means the step depends on the position only through
        the step buffer."""
        if self.recording is None or other.recording is None:
            raise Error("capture: same_launches compares two graphs that recorded a step")
        return self.recording.signature() == other.recording.signature()

    def replay(self, *inputs, position: int) -> list[Tensor]:
        """Run the step again with new input values (one per graph.input, same shape) at
        `position`; returns copies of the outputs."""
        if self.recording is None:
            raise Error("capture: the graph recorded nothing (its block raised, or it was never entered)")
        if len(inputs) != len(self.inputs):
            raise Error(f"capture: replay takes {len(self.inputs)} inputs, got {len(inputs)}")
        backend = self.device.backend
        for t, data in zip(self.inputs, inputs):
            values, shape = flatten_nested(data)
            if shape != t.shape:
                raise ShapeError(f"capture: replay input of shape {shape}, the graph was captured with {t.shape}")
            backend.overwrite(t._storage, struct.pack(f"<{len(values)}{_INPUT_FORMATS[t.dtype.name]}", *values),
                              t.dtype)
        backend.replay(self.recording, position, self.tokens)
        return self.results()

    def results(self) -> list[Tensor]:
        """Copies of the outputs as the last run left them (replays overwrite the outputs themselves)."""
        backend = self.device.backend
        return [Tensor(backend.copy(o._storage, o._layout, o.dtype), Layout(o.shape), o.dtype, self.device)
                for o in self.outputs]


class StepReplays:
    """When to capture and when to replay one sequence's decode steps (CausalLM's caches,
    Whisper's decoder states): the first two steps that fit run eagerly while recording; when
    both bound the same buffers and recorded the same launches, later steps replay the second;
    two that differ turn capture off for the sequence (it decodes eagerly)."""

    def __init__(self) -> None:
        self.graph: Any = None    # (Graph, key) replayed for later steps
        self.pending: Any = None  # (Graph, key) of the last captured step, not yet confirmed
        self.refused = False

    @staticmethod
    def _same(a, b):
        shapes_a, bound_a = a
        shapes_b, bound_b = b
        return shapes_a == shapes_b and len(bound_a) == len(bound_b) and all(x is y for x, y in zip(bound_a, bound_b))

    def run(self, device, position, inputs, step, bound, room):
        """(outputs, replayed) of the step at `position`.
        inputs: [(nested list, dtype)], the values that change per step (token ids);
        step(*tensors): the step's outputs (a list of tensors) computed from those inputs;
        bound(): what the step binds that a replay needs unchanged (KV-cache storages, compared
        by identity); room: False when the step would grow those buffers (it runs eagerly)."""
        key = ([flatten_nested(data)[1] for data, _ in inputs], bound())
        if self.graph is not None:
            graph, kept = self.graph
            if room and self._same(kept, key):
                return graph.replay(*[data for data, _ in inputs], position=position), True
            self.graph = None  # the buffers or shapes changed: capture again
        if self.refused or not room:
            return step(*[tensor(data, dtype, device) for data, dtype in inputs]), False
        graph = capture(device, position=position)
        with graph:
            for out in step(*[graph.input(data, dtype) for data, dtype in inputs]):
                graph.output(out)
        key = (key[0], bound())
        pending, self.pending = self.pending, (graph, key)
        if pending is not None and self._same(pending[1], key):
            if pending[0].same_launches(graph):
                self.graph, self.pending = (graph, key), None
            else:  # something in the step depends on the position beyond the step buffer
                self.refused, self.pending = True, None
        return graph.results(), False


def capture(device=None, position: int = 0, tokens: int = 1) -> Graph:
    """A Graph to use as `with tallow.capture(device, position=...) as graph:` (see the module doc)."""
    dev = _device(device)
    if not dev.backend.can_capture():
        raise UnsupportedError(f"capture: the {dev} device cannot capture and replay launches "
                               "(wgpu, cuda and metal can, and cpu once its numba kernels are in use: "
                               "a quantised model with tallow[cpu]); run the step eagerly")
    return Graph(dev, position, tokens)
