"""Continuous batching: several generations advanced one token each per step, the step shared.

    seqs = [sequence(model, ids, max_tokens=64) for ids in prompts]  # each on a new cache
    firsts = [s.prefill() for s in seqs]        # each prompt alone, as generate_ids runs it
    while live := [s for s in seqs if s.begin()]:
        for s, token in zip(live, step(model, live)):
            ...                                 # token: the next id, or None when s just stopped

A sequence may join (prefill, then take part in the next step) or leave (stop being passed
to step) between any two steps. Each gets exactly the tokens generate_ids gives it alone:
its prompt runs alone, a step of one sequence is the same one-token forward (captured and
replayed where the device can), and a step of several is model.decode_batch, whose rows are
each sequence's own single-step logits. generate_ids itself runs on Sequence (decoding.py).
"""
from .decoding import Sampler, Sequence, _as_stop_ids, _checked_prompt, check_prompt_fits


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
