"""Text generation for the causal language models: sampling, streaming, stop.

    text = model.generate("Once upon a time", max_tokens=50)           # greedy
    for piece in model.stream(prompt, temperature=0.8, top_p=0.95, seed=1):
        print(piece, end="", flush=True)
    reply = model.chat([{"role": "user", "content": "Hi!"}])

The prompt is prefilled in one forward pass; each new token is one decode step
through the model's KV cache. A prompt that starts with the tokens already in
the cache (a chat's growing history) only feeds the new part. Sampling follows
transformers' order: repetition penalty, temperature, top-k, top-p, min-p.

The context window (config.max_position_embeddings, GGUF context_length) is
enforced before any compute: a prompt that leaves no room for a new token
raises ContextWindowError; a generation that fills the window stops with
finish_reason "context". chat(..., history_policy="drop_oldest") drops the
oldest turns instead (chat_history.py).

Several threads may generate from one model at once: each gets the tokens it
would get alone (see models/causal_lm.py: forward holds a lock; a second concurrent
generation uses a private KV cache).
"""
import bisect
import heapq
import itertools
import math
import time

from ..creation import generator, manual_seed
from ..errors import ContextWindowError, DTypeError, Error, FormatError, IndexRangeError
from .chat_history import chat_prompt_ids, fit_history


class Sampler:
    """Picks the next token id from a row of logits. temperature 0 is greedy."""

    def __init__(self, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, rng=None):
        if temperature < 0 or not 0 < top_p <= 1 or not 0 <= min_p <= 1 or repetition_penalty <= 0 or top_k < 0:
            raise ValueError(f"bad sampling settings: temperature={temperature} (>= 0), top_k={top_k} (>= 0), "
                             f"top_p={top_p} (0, 1], min_p={min_p} [0, 1], "
                             f"repetition_penalty={repetition_penalty} (> 0)")
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p
        self.repetition_penalty = repetition_penalty
        self.rng = rng or generator()

    def penalise(self, logits, seen):
        """transformers' repetition penalty: seen tokens' logits are divided by the
        penalty when positive and multiplied by it when negative."""
        if self.repetition_penalty == 1.0 or not seen:
            return logits
        ids = sorted(set(seen))
        old = logits.index_select(0, ids)
        new = (old / self.repetition_penalty).where(old > 0, old * self.repetition_penalty)
        return logits.scatter_add(0, ids, new - old)

    def candidates(self, probs):
        """The token ids top-k, then top-p, then min-p keep (probs: a list over the vocabulary)."""
        if self.top_k and self.top_k < len(probs):
            candidates = heapq.nlargest(self.top_k, range(len(probs)), key=probs.__getitem__)
        else:
            candidates = range(len(probs))
        if self.top_p < 1.0:
            candidates = _nucleus(probs, candidates, self.top_p)
        if self.min_p > 0:
            floor = self.min_p * max(probs[i] for i in candidates)
            candidates = [i for i in candidates if probs[i] >= floor]
        return list(candidates)

    def __call__(self, logits, seen=()):
        """logits: a 1-D tensor over the vocabulary; seen: the ids so far (for the penalty)."""
        logits = self.penalise(logits.float(), seen)
        if self.temperature == 0:
            return int(logits.argmax().item())
        probs = (logits / self.temperature).softmax(-1)
        try:
            from . import sampling_numpy
        except ImportError:  # Pyodide without numpy: the list path
            return self.pick(probs.tolist())
        p = probs.numpy().astype("float64")
        if not sampling_numpy.np.isfinite(p).all():  # NaNs order differently in numpy: the list path
            return self.pick(p.tolist())
        return sampling_numpy.pick(p, self.top_k, self.top_p, self.min_p, self.rng.random)

    def pick(self, probs):
        """The sampled id from probs (a list over the vocabulary): the filters, then a weighted
        draw. The reference that sampling_numpy.pick matches (same rng, same id)."""
        candidates = self.candidates(probs)
        weights = list(itertools.accumulate(probs[i] for i in candidates))
        pick = bisect.bisect_right(weights, self.rng.random() * weights[-1])
        return candidates[min(pick, len(candidates) - 1)]


def _nucleus(probs, candidates, top_p):
    """The most probable candidates whose (renormalised) mass first reaches top_p.
    Takes the largest few first and widens only when needed, so a peaked
    distribution over a big vocabulary is not sorted whole."""
    candidates = list(candidates)
    total = math.fsum(probs[i] for i in candidates)
    k = 64
    while True:
        best = heapq.nlargest(k, candidates, key=probs.__getitem__) if k < len(candidates) else \
            sorted(candidates, key=probs.__getitem__, reverse=True)
        mass = 0.0
        for n, i in enumerate(best):
            mass += probs[i]
            if mass >= top_p * total:
                return best[:n + 1]
        if len(best) == len(candidates):
            return best
        k *= 4


class StopText:
    """Holds back text that could still become a stop string; cuts at the first one."""

    def __init__(self, stops):
        self.stops = [s for s in (stops or ()) if s]
        self.text, self.emitted, self.stopped = "", 0, False

    def feed(self, piece):
        """Add generated text; return what is now safe to show."""
        self.text += piece
        if not self.stops:
            return self._emit(len(self.text))
        longest = max(len(s) for s in self.stops)
        start = max(0, self.emitted - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return self._emit(min(hits))
        held = 0  # the longest tail of the text that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text) - self.emitted), held, -1):
                if self.text.endswith(s[:n]):
                    held = n
                    break
        return self._emit(len(self.text) - held)

    def finish(self):
        return "" if self.stopped else self._emit(len(self.text))

    def _emit(self, end):
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out


class TextStream:
    """The iterator `stream()` returns. After (or during) iteration it reports
    `token_ids` (generated), `prompt_tokens`, `cached_tokens` (the prompt's
    leading tokens reused from the KV cache, not recomputed), `prefill_seconds`,
    `decode_seconds`, `finish_reason` ("stop": a stop token or string; "length":
    max_tokens; "context": the context window is full) and tok/s rates. A chat
    stream also has `messages`: the conversation it answered (fewer than given
    when history_policy="drop_oldest" dropped turns)."""

    def __init__(self, pieces):
        self._pieces = pieces
        self.token_ids = []
        self.prompt_tokens = self.cached_tokens = 0
        self.prefill_seconds = self.decode_seconds = 0.0
        self.finish_reason = None
        self.messages = None

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._pieces)

    @property
    def prefill_tokens_per_second(self):
        fed = self.prompt_tokens - self.cached_tokens
        return fed / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self):
        n = len(self.token_ids) - 1  # the first token comes out of the prefill
        return n / self.decode_seconds if n > 0 and self.decode_seconds else 0.0

    def text(self):
        """Run to the end; the whole text."""
        return "".join(self)


def _prefix_length(a, b):
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # each decoded token: the cache holds a prefix of the ids (one C comparison)
        return n
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _feed(model, ids, cache):
    """Run the ids the cache does not hold yet: (logits of the last position (1-D),
    how many leading ids came from the cache).
    Reuses the longest cached prefix. longrope models switch to their long
    factors once the sequence passes the original context: then the whole
    context is recomputed, as transformers' generate does."""
    held = cache.token_ids
    keep = min(_prefix_length(held, ids), len(ids) - 1)
    switch = model.config.longrope_switch
    if switch is not None and len(ids) > switch and not cache.long_rope:
        keep = 0
    if keep == 0:
        cache.reset()
    elif keep < cache.length:
        cache.truncate(keep)
    logits = model(ids[keep:], cache=cache, last_only=True)
    cache.token_ids = list(ids)
    cache.long_rope = switch is not None and len(ids) > switch
    return logits.reshape(-1), keep


def _as_stop_ids(model, stop_tokens):
    if stop_tokens is None:
        return set(model.eos_token_ids)
    ids = set()
    for t in stop_tokens:
        if isinstance(t, str):
            tid = model.tokenizer.token_to_id(t) if model.tokenizer is not None else None
            if tid is None:
                raise FormatError(f"stop token {t!r} is not in the vocabulary")
            t = tid
        ids.add(int(t))
    return ids


def check_prompt_fits(model, n_prompt):
    """A prompt must leave the context window room for at least one new token.
    n_prompt None: the tokenizer stopped counting past window - 1 (Tokenizer.encode's limit)."""
    window = model.context_window
    if n_prompt is None or n_prompt >= window:
        size = f"more than {window - 1}" if n_prompt is None else n_prompt
        raise ContextWindowError(
            f"the prompt is {size} tokens but {model.config.source} has a context window of {window} "
            f"positions, and the reply needs at least one more: shorten the prompt, or in a chat drop the "
            f"oldest turns (chat(..., history_policy='drop_oldest'); `tallow chat --drop-oldest-turns`)")


def _checked_prompt(ids, vocab_size):
    """The prompt ids as ints in [0, vocab_size): a bad id is refused before it touches the cache."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise DTypeError(f"generate: the prompt must be text or a list of token ids, got {type(ids).__name__}")
    out = []
    for i in ids:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise DTypeError(f"generate: token ids must be integers, got {i!r:.40}")
        out.append(i.__index__())
    if not out:
        raise Error("generate: the prompt has no tokens")
    bad = next((i for i in out if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise IndexRangeError(f"generate: prompt token id {bad} is outside the vocabulary (0 to {vocab_size - 1})")
    return out


def generate_ids(model, ids, max_tokens=256, sampler=None, stop_tokens=None, cache=None, stats=None):
    """Yield new token ids after the prompt ids. Stops at a stop token (not
    yielded; default: the model's eos ids), after max_tokens, or when the
    sequence fills the context window. The prompt is checked against the
    window when this is called, before any compute."""
    sampler = sampler or Sampler()
    stop_ids = _as_stop_ids(model, stop_tokens)
    ids = _checked_prompt(ids, model.config.vocab_size)
    check_prompt_fits(model, len(ids))
    return _generate(model, ids, max_tokens, sampler, stop_ids, cache, stats)


def _generate(model, ids, max_tokens, sampler, stop_ids, cache, stats):
    owned = False
    if cache is None:
        cache, owned = model.claim_cache()
    try:
        yield from _decode(model, ids, max_tokens, sampler, stop_ids, cache, stats)
    finally:
        if owned:
            model.release_cache()


def _decode(model, ids, max_tokens, sampler, stop_ids, cache, stats):
    # the loop is Sequence's, stepped alone (batching.step steps several together)
    seq = Sequence(model, ids, max_tokens, sampler, stop_ids, cache, stats)
    token = seq.prefill()
    while token is not None:
        yield token
        token = seq.next()


class Sequence:
    """One generation's state between steps: its ids (prompt + generated), cache, sampler and
    limits. Mirrors the generate_ids loop: each step first checks the room left (begin), then
    one forward (alone: next(); batched: step()) and one sampled token (take)."""

    def __init__(self, model, ids, max_tokens, sampler, stop_ids, cache, stats=None):
        self.model, self.ids, self.max_tokens = model, ids, max_tokens
        self.sampler, self.stop_ids, self.cache, self.stats = sampler, stop_ids, cache, stats
        self.window = model.context_window
        self.sampled = 0  # tokens sampled (stop tokens included): the loop's iteration count
        self.finished = False
        self.reused = 0
        self.t0 = time.perf_counter()

    def _end(self, reason):
        self.finished = True
        if self.stats is not None:
            self.stats.finish_reason = reason

    def begin(self):
        """True when the sequence takes another step; else it ends here ("length": max_tokens
        sampled; "context": the window is full) and finish_reason says why."""
        if self.finished:
            return False
        if self.sampled >= self.max_tokens:
            self._end("length")
        elif len(self.ids) >= self.window:
            self._end("context")
        return not self.finished

    def prefill(self):
        """The first token (the prompt run alone, reusing the cache's prefix), or None."""
        return self.next()

    def next(self):
        """One step of this sequence alone (the prompt, or the last token through the
        one-token path): the next token, or None when it stopped."""
        if not self.begin():
            return None
        logits, reused = _feed(self.model, self.ids, self.cache)
        if self.sampled == 0:
            self.reused = reused
        return self.take(logits)

    def batchable(self):
        """A decode step (not the prompt) that decode_batch computes as next() would: not a
        longrope model's switch to its long factors, which recomputes the whole context."""
        switch = self.model.config.longrope_switch
        return self.sampled > 0 and (switch is None or len(self.ids) <= switch or self.cache.long_rope)

    def take(self, logits):
        """Sample from this step's logits (1-D): the token, or None for a stop token."""
        token = self.sampler(logits, self.ids)
        now = time.perf_counter()
        stats = self.stats
        if stats is not None:
            if self.sampled == 0:
                stats.prompt_tokens, stats.cached_tokens = len(self.ids), self.reused
                stats.prefill_seconds = now - self.t0
            else:
                stats.decode_seconds += now - self.t0
        self.t0 = now
        self.sampled += 1
        if token in self.stop_ids:
            self._end("stop")
            return None
        self.ids.append(token)
        if stats is not None:
            stats.token_ids.append(token)
        return token


def _prompt_ids(model, prompt, add_special_tokens=True):
    """The prompt's ids; None for a text with more tokens than the window holds (the tokenizer
    stops counting there rather than tokenizing a huge prompt to the end)."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise Error("this model has no tokenizer; pass token ids instead of text")
        return model.tokenizer.encode(prompt, add_special_tokens=add_special_tokens,
                                      limit=max(model.context_window - 1, 0))
    return prompt  # token ids: checked by generate_ids


def stream(model, prompt, max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
           seed=None, stop=None, stop_tokens=None, add_special_tokens=True):
    """A TextStream of text pieces continuing `prompt` (text or token ids).
    stop: strings that end generation (not emitted); stop_tokens: ids (or token
    strings) that end it, default the model's eos. seed: reseeds tallow's generator."""
    if model.tokenizer is None:
        raise Error("stream() needs a tokenizer to turn tokens into text; use generate_ids() with token ids")
    if seed is not None:
        manual_seed(seed)
    sampler = Sampler(temperature, top_k, top_p, min_p, repetition_penalty)
    ids = _prompt_ids(model, prompt, add_special_tokens)
    check_prompt_fits(model, None if ids is None else len(ids))  # now, not at the first next()
    out = TextStream(None)

    def pieces():
        decoder = model.tokenizer.stream_decoder(skip_special_tokens=True)
        stops = StopText([stop] if isinstance(stop, str) else stop)
        for token in generate_ids(model, ids, max_tokens, sampler, stop_tokens, stats=out):
            piece = stops.feed(decoder.step(token))
            if piece:
                yield piece
            if stops.stopped:
                out.finish_reason = "stop"
                return
        tail = stops.feed(decoder.flush())
        tail += stops.finish()
        if tail:
            yield tail
        if stops.stopped:
            out.finish_reason = "stop"

    out._pieces = pieces()
    return out


_stream = stream  # chat() takes a `stream` flag that hides the function


def generate(model, prompt, **options):
    """The generated text (see stream() for the options)."""
    return stream(model, prompt, **options).text()


HISTORY_POLICIES = ("error", "drop_oldest")


def chat(model, messages, stream=False, history_policy="error", **options):
    """The assistant's reply to `messages` (a TextStream when stream=True).
    history_policy: "error" (a conversation past the context window raises
    ContextWindowError) or "drop_oldest" (drop the oldest turns, keeping system
    messages and the last message, until the prompt leaves room for max_tokens;
    the stream's `messages` is what was kept)."""
    if history_policy not in HISTORY_POLICIES:
        raise Error(f"chat: history_policy must be one of {HISTORY_POLICIES}, not {history_policy!r}")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if history_policy == "drop_oldest":
        messages, ids = fit_history(model, messages, options.get("max_tokens", 256))
    else:
        ids = chat_prompt_ids(model, messages, limit=max(model.context_window - 1, 0))
        check_prompt_fits(model, None if ids is None else len(ids))
    s = _stream(model, ids, **options)
    s.messages = list(messages)
    return s if stream else s.text()
