"""Continuous batching: several generations advanced one token each per step, the step shared.

    seqs = [Sequence(model, ids, 64, Sampler(), model.eos_token_ids, model.new_cache()) for ids in prompts]
    firsts = [s.prefill() for s in seqs]        # each prompt alone, as generate_ids runs it
    while live := [s for s in seqs if s.begin()]:
        for s, token in zip(live, step(model, live)):
            ...                                 # token: the next id, or None when s just stopped

A sequence may join (prefill, then take part in the next step) or leave (stop being passed
to step) between any two steps. Each gets exactly the tokens generate_ids gives it alone:
its prompt runs alone, a step of one sequence is the same one-token forward (captured and
replayed where the device can), and a step of several is model.decode_batch, whose rows are
each sequence's own single-step logits. generate_ids itself runs on Sequence (decoding._decode).
"""
import time

from .decoding import Sampler, _as_stop_ids, _checked_prompt, _feed, check_prompt_fits


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


def sequence(model, ids, max_tokens=256, sampler=None, stop_tokens=None, cache=None, stats=None):
    """A Sequence for the prompt ids, checked as generate_ids checks them (ids, the window);
    cache: default a new one (model.new_cache())."""
    stop_ids = _as_stop_ids(model, stop_tokens)
    ids = _checked_prompt(ids, model.config.vocab_size)
    check_prompt_fits(model, len(ids))
    cache = model.new_cache() if cache is None else cache
    return Sequence(model, ids, max_tokens, sampler or Sampler(), stop_ids, cache, stats)


def step(model, seqs):
    """Advance each sequence (begin() was True for each) by one token: their tokens (None:
    that sequence stopped), in order. One sequence, or one that cannot batch, steps alone;
    the rest share one model.decode_batch."""
    tokens = [None] * len(seqs)
    together = [i for i, s in enumerate(seqs) if s.batchable()] if len(seqs) > 1 else []
    if len(together) > 1:
        batch = [seqs[i] for i in together]
        logits = model.decode_batch([s.ids[-1] for s in batch], [s.cache for s in batch])
        switch = model.config.longrope_switch
        for row, (i, s) in enumerate(zip(together, batch)):
            s.cache.token_ids = list(s.ids)  # what _feed records: the ids the cache holds
            s.cache.long_rope = switch is not None and len(s.ids) > switch
            tokens[i] = s.take(logits[row])
    else:
        together = []
    batched = set(together)
    for i, s in enumerate(seqs):
        if i not in batched:
            tokens[i] = s.next()
    return tokens
