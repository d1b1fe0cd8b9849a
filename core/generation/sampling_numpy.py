"""The sampler's filters and draw on a numpy array of probabilities (float64 holding the
float32 softmax), picking exactly what Sampler's list path picks (decoding.py, the reference,
kept for Pyodide without numpy) from the same random draw:

* the same order: most probable first, ties to the earlier candidate (heapq.nlargest and
  sorted(..., reverse=True) are stable; so is argsort(kind="stable") of the negated values);
* the same sums: math.fsum for top-p's total (exactly rounded, so any order), np.cumsum for the
  running masses and weights (float64 added one after another, as the Python loops do).

On SmolLM2's 49152-entry vocabulary the list path spent 8-14 ms a token building the list and
its sums in Python; here it is well under a millisecond plus top-p's fsum.
"""
import math

import numpy as np


def pick(probs, top_k, top_p, min_p, draw):
    """The sampled id: Sampler.candidates (top-k, top-p, min-p) then the weighted draw, with
    draw() the one uniform number in [0, 1) the list path would take."""
    cand = None  # None: every id, in order (no index array to gather through)
    if top_k and top_k < probs.size:
        cand = _largest(probs, cand, top_k)
    if top_p < 1.0:
        cand = _nucleus(probs, cand, top_p)
    vals = probs if cand is None else probs[cand]
    if min_p > 0:
        keep = vals >= min_p * float(vals.max())
        cand = np.flatnonzero(keep) if cand is None else cand[keep]
        vals = vals[keep]
    weights = np.cumsum(vals)
    at = min(int(np.searchsorted(weights, draw() * float(weights[-1]), side="right")), vals.size - 1)
    return at if cand is None else int(cand[at])


def _largest(probs, cand, k):
    """The k candidates (ids; cand None: every id) of largest probability, most probable first,
    ties to the earlier candidate: heapq.nlargest(k, cand, key=probs.__getitem__)."""
    vals = probs if cand is None else probs[cand]
    if k < vals.size:
        kth = np.partition(vals, vals.size - k)[vals.size - k]  # the k-th largest value
        above = np.flatnonzero(vals > kth)
        # the boundary value's ties: the earliest ones fill the k (as a stable sort keeps them)
        keep = np.concatenate([above, np.flatnonzero(vals == kth)[:k - above.size]])
        keep.sort()
        keep = keep[np.argsort(-vals[keep], kind="stable")]
    else:
        keep = np.argsort(-vals, kind="stable")
    return keep if cand is None else cand[keep]


def _nucleus(probs, cand, top_p):
    """decoding._nucleus: the most probable candidates whose mass first reaches top_p of their
    total, widening the look from the 64 largest only when needed."""
    size = probs.size if cand is None else cand.size
    total = math.fsum((probs if cand is None else probs[cand]).tolist())
    target = top_p * total
    k = 64
    while True:
        best = _largest(probs, cand, k)
        reached = np.flatnonzero(np.cumsum(probs[best]) >= target)
        if reached.size:
            return best[:reached[0] + 1]
        if best.size == size:
            return best
        k *= 4
