"""The base of the decoder-only language models: input handling, the KV cache
kept across calls, logits, and the generation entry points.

    logits = model([1, 2, 3])      # prefill: (1, 3, vocab); the cache now holds 3 positions
    logits = model([4])            # one decode step at position 3
    model.reset()                  # forget the context (its buffers stay for the next one)

An explicit `cache=model.new_cache()` runs an independent sequence without
touching the model's own cache.

Threads: one model may serve several threads. Each forward pass holds the
model's lock (the rotary tables and backend state are shared), and a generation
that finds the model's own cache in use by another generation runs on a private
cache, so each caller gets the tokens it would get alone. Direct `model(ids)`
calls on the model's own cache from two threads still interleave one sequence:
give each thread its own `cache=model.new_cache()`.

A sequence may not pass `config.max_position_embeddings` positions (the context
window): forward raises ContextWindowError before computing anything.

One-token decode steps on a device that captures (tallow.capture: wgpu natively) are
captured and replayed: the first two steps on a cache run eagerly while recording their
launches; when the two recordings match (nothing but the step buffer depends on the
position), later steps replay the recording with the new token id and position, no
Python per op. A step whose shape differs (a prompt, a batch) or that would grow the KV
cache past the captured capacity runs eagerly; the next one-token steps capture again.
Sliding-window layers (Gemma 3) capture where the backend slides the window at replay
(Backend.captures_windows: the cpu device); elsewhere such a model decodes eagerly.
`model.capture_decode = False` turns this off.
"""
import threading

from .. import dtypes as D
from ..step_capture import StepReplays
from ..creation import cat, tensor
from ..errors import ContextWindowError, IndexRangeError, ShapeError
from ..nn import KVCache, Module, RotaryEmbedding
from ..tensor import Tensor
from .attention import BatchStep, Step


def _one_token(input_ids):
    """The token id when input_ids is one Python int id ([t] or [[t]]), else None."""
    if isinstance(input_ids, (list, tuple)) and len(input_ids) == 1:
        t = input_ids[0]
        if isinstance(t, (list, tuple)) and len(t) == 1:
            t = t[0]
        if isinstance(t, int) and not isinstance(t, bool):
            return t
    return None


class DecoderCache:
    """One KVCache per layer; `length` is the number of positions already seen.
    Generation records which token ids produced it (token_ids) and whether
    longrope's long factors were in force (long_rope), to reuse a prefix."""

    def __init__(self, num_layers):
        self.layers = [KVCache() for _ in range(num_layers)]
        self.token_ids = []
        self.long_rope = False
        self.replays = StepReplays()  # captured one-token steps on this cache (tallow.step_capture)

    @property
    def graph(self):
        """The (Graph, key) one-token steps replay, or None."""
        return self.replays.graph

    @property
    def capture_refused(self):
        """Two captures differed: this cache decodes eagerly."""
        return self.replays.refused

    def advance(self, t):
        """Count t positions a replayed step wrote into every layer's cache."""
        for c in self.layers:
            c.length += t

    @property
    def length(self):
        return self.layers[0].length if self.layers else 0

    def reset(self):
        """Forget the positions; the KV buffers and the captured step stay (replays check that
        they bind the same buffers, so a new sequence replays from its first decode step)."""
        for c in self.layers:
            c.reset()
        self.token_ids = []
        self.long_rope = False

    def truncate(self, length):
        """Keep the first `length` positions (to reuse a shared prompt prefix)."""
        for c in self.layers:
            c.truncate(length)
        del self.token_ids[length:]


class _BatchLayers:
    """What run_layers reads of a cache, for a batch: per layer, the sequences' KVCaches."""

    def __init__(self, layers):
        self.layers = layers


class CausalLM(Module):
    """Subclasses build `self.layers` (each `layer(hidden, step, kv_cache)`), and
    define `embed(ids)`, `final_norm(hidden)` and `lm_head(hidden)`; they may override
    run_layers / final_add_norm to carry a residual add into the next norm."""
    kind = "llm"  # what the model does, for front ends that serve several (the web worker)
    capture_decode = True  # replay captured one-token steps where the device can (see the module doc)

    def __init__(self, config, device, dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        self._tokenizer_lock = threading.Lock()
        self.tokenizer = None
        # One rotary table per layer type (Gemma 3's sliding layers have their own base).
        self.rotaries = {kind: RotaryEmbedding(config.rotary_dim, theta, scaling, device, dtype)
                         for kind, (theta, scaling) in config.ropes.items()}
        self.cache = None
        self._lock = threading.RLock()
        self._cache_in_use = False
        self._weight_dtypes = None  # of the 2-D weights (batch_rows), found once

    @property
    def tokenizer(self):
        """The model's Tokenizer, or None. A GGUF's metadata is checked at load, and the tokenizer
        built from it on first use (load_gguf: a 151,936-token BPE's maps take ~0.4 s of CPU that
        load_model does not wait for), so the first encode, decode or generate() pays that; an
        error the build raises is raised on every use."""
        if self._make_tokenizer is not None:
            with self._tokenizer_lock:
                if self._make_tokenizer is not None:
                    self._tokenizer = self._make_tokenizer()
                    self._make_tokenizer = None
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value):
        self._tokenizer, self._make_tokenizer = value, None

    def tokenizer_on_first_use(self, make):
        """make(): the Tokenizer, called when `tokenizer` is first read."""
        self._tokenizer, self._make_tokenizer = None, make

    def _finish_init(self):
        self.cache = self.new_cache()

    def new_cache(self):
        return DecoderCache(self.config.num_layers)

    def reset(self):
        self.cache.reset()

    @property
    def context_window(self):
        """The most positions a sequence may hold (context_length / max_position_embeddings)."""
        return self.config.max_position_embeddings

    def claim_cache(self):
        """(cache, owned) for one generation: the model's own cache (reusing its
        prefix) when no other generation holds it, else a fresh private one."""
        with self._lock:
            if self._cache_in_use:
                return self.new_cache(), False
            self._cache_in_use = True
            return self.cache, True

    def release_cache(self):
        with self._lock:
            self._cache_in_use = False

    @property
    def eos_token_ids(self):
        """Token ids that end a reply: the config's, then the tokenizer's eos."""
        ids = list(self.config.eos_token_ids)
        tok = self.tokenizer
        if tok is not None and tok.eos_id is not None and tok.eos_id not in ids:
            ids.append(tok.eos_id)
        return ids

    def _ids(self, input_ids):
        if isinstance(input_ids, Tensor):
            ids = input_ids if input_ids.device is self.device else input_ids.to(self.device)
        else:
            ids = tensor(input_ids, D.i64, self.device)
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ShapeError(f"input_ids must be (seq,) or (batch, seq) with seq > 0, got shape {ids.shape}")
        if ids.dtype.is_float:
            raise ShapeError(f"input_ids must be integers, got {ids.dtype.name}")
        return ids

    def forward(self, input_ids, cache=None, last_only=False):
        """Logits (batch, seq, vocab) for the new tokens; last_only keeps just the
        final position (batch, 1, vocab), which is all generation needs."""
        cache = self.cache if cache is None else cache
        token = _one_token(input_ids)
        if token is not None and self._captures():
            self._check_fits(cache, 1)
            if not 0 <= token < self.config.vocab_size:
                raise IndexRangeError(f"embedding: id {token} is out of range for dim 0 of size "
                                      f"{self.config.vocab_size} (valid: 0 to {self.config.vocab_size - 1})")
            with self._lock:
                return self._decode_one(token, cache, last_only)
        ids = self._ids(input_ids)
        self._check_fits(cache, ids.shape[1])
        with self._lock:
            return self._forward(ids, cache, last_only)

    def decode_batch(self, tokens, caches):
        """Logits (len(tokens), vocab): one decode step of several sequences, token i appended to
        caches[i] (each a different cache, from new_cache() or the model's own), as each would
        step alone: row i equals forward([tokens[i]], cache=caches[i], last_only=True)."""
        if len(tokens) != len(caches) or not tokens:
            raise ShapeError(f"decode_batch: {len(tokens)} tokens for {len(caches)} caches (one token per cache)")
        if len({id(c) for c in caches}) != len(caches):
            raise ShapeError("decode_batch: a cache is given twice (each sequence needs its own)")
        vocab = self.config.vocab_size
        for t, cache in zip(tokens, caches):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise IndexRangeError(f"decode_batch: token id {t!r} is outside the vocabulary (0 to {vocab - 1})")
            self._check_fits(cache, 1)
        rows = self.batch_rows()
        parts = [self._decode_rows(tokens[i:i + rows], caches[i:i + rows]) for i in range(0, len(tokens), rows)]
        return parts[0] if len(parts) == 1 else cat(parts, 0)

    def batch_rows(self):
        """How many sequences one batched step runs together: the fewest rows any of the model's
        weights' products computes row by row as it computes one (backend.batch_rows); larger
        batches step in groups of this many, and 1 steps each sequence alone."""
        if self._weight_dtypes is None:
            self._weight_dtypes = {p.dtype for _, p in self.named_parameters() if p.ndim == 2}
        backend = self.device.backend  # asked each time: it may follow settings ($TALLOW_CPU)
        return max(1, min((backend.batch_rows(d, self.dtype) for d in self._weight_dtypes), default=1))

    def _decode_rows(self, tokens, caches):
        vocab = self.config.vocab_size
        if len(tokens) == 1:  # one sequence: the one-token path (captured and replayed where the device can)
            return self.forward([tokens[0]], cache=caches[0], last_only=True).reshape(1, vocab)
        with self._lock:
            cfg = self.config
            ids = tensor([[t] for t in tokens], D.i64, self.device)
            offsets = [c.length for c in caches]
            steps = {kind: BatchStep(offsets, self.rotaries[kind], cfg.window(kind), self.device)
                     for kind in set(cfg.layer_types)}
            layers = [[c.layers[i] for c in caches] for i in range(cfg.num_layers)]
            hidden, pending = self.run_layers(self.embed(ids), [steps[kind] for kind in cfg.layer_types],
                                              _BatchLayers(layers))
            return self.lm_head(self.final_add_norm(hidden, pending)).reshape(len(tokens), vocab)

    def _check_fits(self, cache, new):
        if cache.length + new > self.context_window:
            raise ContextWindowError(
                f"{self.config.source}: {cache.length} cached + {new} new positions pass the model's "
                f"context window of {self.context_window}; reset() or use a shorter input")

    # ---- captured one-token decode (tallow.capture) ------------------------------------
    def _captures(self):
        cfg = self.config
        backend = self.device.backend
        return (self.capture_decode and backend.can_capture()
                and (backend.captures_windows() or all(cfg.window(kind) is None for kind in set(cfg.layer_types))))

    def _fixed(self, cache, position):
        """What a recorded step bound that a later step must find unchanged: every layer's KV
        buffers (a cache that grows gets new ones) and the rotary tables at this position."""
        tables = [t._storage for rot in self.rotaries.values() for t in rot.tables(position, 1)]
        return [c.k for c in cache.layers] + [c.v for c in cache.layers] + tables

    def _decode_one(self, token, cache, last_only):
        """Logits (1, 1, vocab) of one token: a replay of the cache's captured step when it still
        fits (same KV buffers, room in the cache), else an eager step captured on the way."""
        first = cache.layers[0] if cache.layers else None
        # A step that grows the KV cache copies it: a capture must not record that, so it runs eagerly.
        room = first is not None and first.k is not None and cache.length < first.k.shape[2]
        (logits,), replayed = cache.replays.run(
            self.device, cache.length, [([[token]], D.i64)],
            lambda ids: [self._forward(ids, cache, last_only)],
            lambda: self._fixed(cache, cache.length), room)
        if replayed:
            cache.advance(1)
        return logits

    def _forward(self, ids, cache, last_only):
        cfg = self.config
        steps = {kind: Step(cache.length, ids.shape[1], self.rotaries[kind], cfg.window(kind), self.device)
                 for kind in set(cfg.layer_types)}
        hidden, pending = self.run_layers(self.embed(ids), [steps[kind] for kind in cfg.layer_types], cache)
        if last_only and hidden.shape[1] > 1:
            hidden = hidden.narrow(1, hidden.shape[1] - 1, 1)
            pending = None if pending is None else pending.narrow(1, pending.shape[1] - 1, 1)
        return self.lm_head(self.final_add_norm(hidden, pending))

    def run_layers(self, hidden, steps, cache):
        """(hidden, pending): the layers' output as a sum hidden + pending, pending None when there
        is nothing left to add. A model whose blocks fuse the residual add into the next norm
        (Llama) hands the last block's addend on, and final_add_norm adds it."""
        for layer, step, kv in zip(self.layers, steps, cache.layers):
            hidden = layer(hidden, step, kv)
        return hidden, None

    def final_add_norm(self, hidden, pending):
        """final_norm(hidden + pending); pending may be None."""
        return self.final_norm(hidden if pending is None else hidden + pending)

    # ---- generation (tallow.generation) --------------------------------------------
    def generate(self, prompt, **options):
        """Text continuation of a prompt (str or token ids); see tallow.generation.generate."""
        from ..generation import generate
        return generate(self, prompt, **options)

    def stream(self, prompt, **options):
        """An iterator of text pieces as they are generated; see tallow.generation.stream."""
        from ..generation import stream
        return stream(self, prompt, **options)

    def chat(self, messages, stream=False, **options):
        """Reply to a conversation [{"role": ..., "content": ...}] through the chat template."""
        from ..generation import chat
        return chat(self, messages, stream=stream, **options)

    def __repr__(self):
        return f"{type(self).__name__}({self.config!r}, device={self.device})"
