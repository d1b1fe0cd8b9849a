"""One language model used from several threads at once: each caller gets the
tokens it gets alone (the model's forward holds a lock; a second concurrent
generation runs on a private KV cache). A tiny random Llama against
transformers, and the real SmolLM2-135M-Instruct GGUF."""
import threading

import pytest

import tallow
from tallow.generation import chat_prompt_ids, generate_ids

pytest.importorskip("jinja2")

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
TOKENS = 8


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return tallow.load_model(smollm2_gguf)


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


def test_four_threads_match_transformers_greedy(tmp_path):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    ref = tf.LlamaForCausalLM(cfg).eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    prompts = [[3, 17, 99, 5], [200, 31, 7, 8, 9, 10], [42], [1, 2, 3, 4, 5, 6, 7, 8]]
    with torch.no_grad():
        want = [ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=16, do_sample=False)[0, len(p):].tolist() for p in prompts]
    model = tallow.load_model(tmp_path)
    got = _run_together([lambda p=p: list(generate_ids(model, p, max_tokens=16, stop_tokens=[])) for p in prompts])
    assert got == want


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
