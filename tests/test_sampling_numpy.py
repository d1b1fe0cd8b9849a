"""The sampler's numpy path (generation/sampling_numpy.py) picks exactly the id its list path
(Sampler.pick, whose filters test_generate.py checks against transformers) picks from the same
random draws: flat, peaked and tied distributions, every filter, small and SmolLM2-sized vocabularies."""
import random

import numpy as np
import pytest

import tallow
from tallow.generation import Sampler
from tallow.generation import sampling_numpy

SETTINGS = [(0, 1.0, 0.0), (1, 1.0, 0.0), (5, 1.0, 0.0), (40, 1.0, 0.0), (10**6, 1.0, 0.0), (0, 0.9, 0.0),
            (0, 0.3, 0.0), (0, 0.999999, 0.0), (0, 1e-9, 0.0), (0, 1.0, 0.1), (0, 1.0, 1.0), (20, 0.8, 0.05),
            (300, 0.95, 0.02)]


def _probs(rng, n, kind):
    """float32 softmax probabilities as the sampler sees them (float64 holding float32 values)."""
    x = rng.standard_normal(n) * {"flat": 0.3, "normal": 3.0, "peaked": 12.0, "tied": 2.0}[kind]
    if kind == "tied":
        x = np.round(x)  # few distinct logits: many equal probabilities, ties at every filter's boundary
    return tallow.tensor(x.astype(np.float32)).softmax(-1).numpy().astype(np.float64)


@pytest.mark.parametrize("top_k,top_p,min_p", SETTINGS)
def test_the_numpy_path_picks_what_the_list_path_picks(top_k, top_p, min_p):
    rng = np.random.default_rng(top_k + int(1000 * top_p) + int(100 * min_p))
    for n in (1, 2, 7, 300, 2000):
        for kind in ("flat", "normal", "peaked", "tied"):
            probs = _probs(rng, n, kind)
            seed = int(rng.integers(1 << 30))
            want_rng, got_rng = random.Random(seed), random.Random(seed)
            reference = Sampler(1.0, top_k, top_p, min_p, rng=want_rng)
            for _ in range(5):
                want = reference.pick(probs.tolist())
                assert sampling_numpy.pick(probs, top_k, top_p, min_p, got_rng.random) == want, (n, kind)


def test_a_smollm2_sized_vocabulary_samples_the_same_through_the_sampler():
    # Sampler.__call__ takes the numpy path on a tensor; the list path on the same draws agrees.
    rng = np.random.default_rng(5)
    logits = tallow.tensor((rng.standard_normal(49152) * 4).astype(np.float32))
    for top_k, top_p, min_p in [(0, 1.0, 0.0), (40, 0.95, 0.05), (0, 0.9, 0.0)]:
        fast = Sampler(0.7, top_k, top_p, min_p, rng=random.Random(11))
        reference = Sampler(0.7, top_k, top_p, min_p, rng=random.Random(11))
        probs = (logits / 0.7).softmax(-1).tolist()
        assert [fast(logits) for _ in range(3)] == [reference.pick(probs) for _ in range(3)]


def test_nan_probabilities_keep_the_list_path():
    logits = tallow.tensor([0.0, float("nan"), 1.0])
    fast, reference = Sampler(1.0, rng=random.Random(3)), Sampler(1.0, rng=random.Random(3))
    assert fast(logits) == reference.pick(logits.softmax(-1).tolist())
