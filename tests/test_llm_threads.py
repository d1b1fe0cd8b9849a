"""One language model used from several threads at once: each caller gets the
tokens it gets alone (the model's forward holds a lock; a second concurrent
generation runs on a private KV cache). The real SmolLM2-135M-Instruct GGUF."""
import os
import threading

import pytest

import tallow
from tallow.generate import chat_prompt_ids, generate_ids

pytest.importorskip("jinja2")

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
TOKENS = 8


@pytest.fixture(scope="module")
def smollm2():
    path = os.environ.get("TALLOW_SMOLLM2_GGUF") or os.path.join(
        tallow.hub.home(), "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip("SmolLM2 GGUF not found: set TALLOW_SMOLLM2_GGUF or run `tallow fetch smollm2-135m-instruct`")
    return tallow.load_model(path)


def _run_together(jobs):
    """Start every job at the same moment on its own thread; their results in order."""
    barrier = threading.Barrier(len(jobs))
    results, errors = [None] * len(jobs), []

    def worker(i, job):
        try:
            barrier.wait()
            results[i] = job()
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a generating thread hung"
    assert not errors, errors
    return results


@pytest.mark.slow
def test_threads_get_the_tokens_of_sequential_runs(smollm2):
    ids = [chat_prompt_ids(smollm2, [{"role": "user", "content": p}]) for p in PROMPTS]
    sequential = [list(generate_ids(smollm2, i, max_tokens=TOKENS, stop_tokens=[])) for i in ids]
    assert len({tuple(s) for s in sequential}) == len(PROMPTS)  # different prompts, different answers
    together = _run_together([lambda i=i: list(generate_ids(smollm2, i, max_tokens=TOKENS, stop_tokens=[]))
                              for i in ids])
    assert together == sequential
    # Afterwards the model's own cache is free again: the next run reuses its prefix (the shared system prompt).
    stream = smollm2.stream(ids[0], max_tokens=1, stop_tokens=[])
    stream.text()
    assert stream.cached_tokens > 0
