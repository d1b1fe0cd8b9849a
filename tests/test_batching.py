"""Batched decoding (continuous batching): several sequences decode in one step, each with its
own KV cache at its own length, and each gets exactly what it gets alone.

- model level: CausalLM.decode_batch's row i equals the single one-token step of sequence i
  (bitwise: the backend shares a product among at most batch_rows() rows, as many as its
  kernel computes each exactly as one row alone: 8 on the CPU's integer-dot kernels; a
  backend forced to share float products shows BatchStep's per-row work agreeing to rounding);
- generation level: tallow.generation.sequence/step with sequences joining and leaving at
  different steps give each prompt generate_ids' greedy tokens alone;
on the CPU kernels (the default), TALLOW_CPU=numpy and wgpu (lavapipe here), with tiny
random-weight models of each decoder family and the real SmolLM2-135M Q4_1."""
import numpy as np
import pytest

import tallow
from tallow.errors import IndexRangeError, ShapeError
from tallow.generation import generate_ids, sequence, step

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

PROMPTS = [[3, 17, 99, 5], [200, 31, 7, 8, 9, 10, 11, 12, 13], [42], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14],
           [250, 251], [60, 61, 62, 63, 64, 65], [7, 7, 7], [120, 19, 88, 4, 33]]


def _tiny(kind, path, **overrides):
    """A random transformers model of a tiny config of the family, saved to path; its folder."""
    torch.manual_seed(0)
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                initializer_range=0.1)
    base.update(overrides)
    config_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "phi": (tf.PhiConfig, tf.PhiForCausalLM),
                             "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM)}[kind]
    model_cls(config_cls(**base)).eval().save_pretrained(path, safe_serialization=True)
    return path


# phi: partial rotary (rotated per row before attention); gemma3: a sliding window shorter than the sequences
FAMILIES = {"llama": {}, "phi": {"partial_rotary_factor": 0.5}, "gemma3": {"sliding_window": 6}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny_path(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory.mktemp(request.param), **FAMILIES[request.param])


def _prefilled(model, prompts):
    """(caches, first tokens): each prompt run alone on its own cache."""
    caches, tokens = [], []
    for p in prompts:
        cache = model.new_cache()
        tokens.append(int(model(p, cache=cache, last_only=True).reshape(-1).argmax().item()))
        caches.append(cache)
    return caches, tokens


def _rows_match_single_steps(model, prompts, steps, exact=True):
    """decode_batch's rows against each sequence's single steps (run afterwards on copies of the
    same prefill), for `steps` greedy steps: equal (exact), else the same greedy token; the
    largest difference."""
    caches, tokens = _prefilled(model, prompts)
    batched = []
    for _ in range(steps):
        logits = model.decode_batch(tokens, caches).numpy()
        batched.append(logits)
        tokens = [int(np.argmax(row)) for row in logits]
    singles_caches, first = _prefilled(model, prompts)
    worst = 0.0
    for i, (cache, token) in enumerate(zip(singles_caches, first)):
        for s in range(steps):
            row = model([token], cache=cache, last_only=True).reshape(-1).numpy()
            if exact:
                assert np.array_equal(row, batched[s][i]), (i, s, float(np.abs(row - batched[s][i]).max()))
            worst = max(worst, float(np.abs(row - batched[s][i]).max()))
            token = int(np.argmax(row))
            assert token == int(np.argmax(batched[s][i])), (i, s)
    return worst


@pytest.fixture
def forced_rows(monkeypatch):
    """Make a device's backend batch up to 8 rows of float products too (products that BLAS or
    a dense kernel may sum in another order for 8 rows than for 1): BatchStep's rotation, cache
    writes and attention then run on the tiny float models, whose rows agree to rounding."""
    def force(device):
        monkeypatch.setattr(type(device.backend), "batch_rows", lambda self, wdtype, dtype: 8)
    return force


def test_float_weights_on_the_cpu_step_each_sequence_alone(tiny_path):
    model = tallow.load_model(tiny_path, device="cpu")
    assert model.batch_rows() == 1  # BLAS's products differ with the row count: no shared rows
    _rows_match_single_steps(model, PROMPTS[:5], 4)


def test_batched_rows_follow_each_sequence(tiny_path, forced_rows):
    """Each row rotated at its own position, written into its own cache, attending over its own
    keys (partial rotary: phi; a sliding window shorter than the sequences: gemma3)."""
    model = tallow.load_model(tiny_path, device="cpu")
    forced_rows(model.device)
    assert model.batch_rows() == 8
    worst = _rows_match_single_steps(model, PROMPTS[:5], 6, exact=False)
    assert worst < 1e-4, worst


def _schedule(model, prompts, max_tokens, stop_tokens=None, join_every=2):
    """Continuous batching by hand: prompt i joins after 2*i steps; each leaves at its own
    max_tokens (max_tokens - i) or at a stop token. The tokens each got, and the largest batch stepped."""
    out = [[] for _ in prompts]
    waiting, live, n, peak = list(range(len(prompts))), [], 0, 0
    while waiting or live:
        if waiting and n % join_every == 0:
            i = waiting.pop(0)
            s = sequence(model, prompts[i], max_tokens - i, stop_tokens=stop_tokens, cache=model.new_cache())
            s.index = i
            first = s.prefill()
            if first is not None:
                out[i].append(first)
                live.append(s)
        live = [s for s in live if s.begin()]
        n += 1
        if not live:
            continue
        peak = max(peak, len(live))
        for s, token in zip(live, step(model, live)):
            if token is not None:
                out[s.index].append(token)
    return out, peak


def _alone(model, prompts, max_tokens, stop_tokens=None):
    return [list(generate_ids(model, p, max_tokens - i, stop_tokens=stop_tokens, cache=model.new_cache()))
            for i, p in enumerate(prompts)]


def test_joining_and_leaving_gives_each_its_tokens_alone(tiny_path):
    model = tallow.load_model(tiny_path, device="cpu")
    got, peak = _schedule(model, PROMPTS, 24)
    assert got == _alone(model, PROMPTS, 24) and peak >= 4


def test_decode_batch_refuses_bad_input(tiny_path):
    model = tallow.load_model(tiny_path, device="cpu")
    caches, tokens = _prefilled(model, PROMPTS[:2])
    with pytest.raises(ShapeError, match="given twice"):
        model.decode_batch(tokens, [caches[0], caches[0]])
    with pytest.raises(ShapeError, match="3 tokens for 2 caches"):
        model.decode_batch(tokens + [1], caches)
    with pytest.raises(IndexRangeError, match="outside the vocabulary"):
        model.decode_batch([tokens[0], 300], caches)
    assert [c.length for c in caches] == [len(p) for p in PROMPTS[:2]]  # refused before any compute


@pytest.mark.slow
def test_batched_rows_on_wgpu(tiny_path, wgpu, forced_rows):
    model = tallow.load_model(tiny_path, device=wgpu)
    got, _ = _schedule(model, PROMPTS[:4], 10)
    assert got == _alone(model, PROMPTS[:4], 10)
    forced_rows(wgpu)
    worst = _rows_match_single_steps(model, PROMPTS[:4], 4, exact=False)
    assert worst < 1e-4, worst


# ---- the real SmolLM2-135M Q4_1: quantised products (the integer-dot kernels on the CPU) ----------
TEXTS = ["What is the capital of France?", "Hi", "Write a haiku about the sea.", "1 2 3 4 5",
         "Tell me about dragons and knights in the old days of", "Why is the sky blue?", "Name a fruit",
         "Count to ten, slowly, and then count back down to one:"]


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2_gguf):
    model = tallow.load_model(smollm2_gguf, device="cpu")
    return [model.tokenizer.encode(t) for t in TEXTS]


@pytest.mark.models
@pytest.mark.parametrize("cpu", ["kernels", "numpy"])
def test_smollm2_batched_greedy_is_each_alone(smollm2_gguf, smollm2_prompts, cpu, monkeypatch):
    if cpu == "numpy":
        monkeypatch.setenv("TALLOW_CPU", "numpy")
    model = tallow.load_model(smollm2_gguf, device="cpu")
    # the integer-dot kernels share 8 rows exactly; numpy's BLAS products step each sequence alone
    assert model.batch_rows() == (8 if cpu == "kernels" else 1)
    _rows_match_single_steps(model, smollm2_prompts[:4], 3)
    # no stop tokens: these bare prompts may end at once; each leaves at its own max_tokens (26 - i)
    got, peak = _schedule(model, smollm2_prompts, 26, stop_tokens=[])
    assert got == _alone(model, smollm2_prompts, 26, stop_tokens=[]) and peak == len(TEXTS)


@pytest.mark.models
@pytest.mark.slow
def test_smollm2_batched_greedy_on_wgpu(smollm2_gguf, smollm2_prompts, wgpu):
    """The quantised matvec kernels take up to 64 rows, each summed as one row alone."""
    model = tallow.load_model(smollm2_gguf, device=wgpu)
    assert model.batch_rows() > 1
    _rows_match_single_steps(model, smollm2_prompts[:4], 2)
    got, peak = _schedule(model, smollm2_prompts[:4], 8, stop_tokens=[])
    assert got == _alone(model, smollm2_prompts[:4], 8, stop_tokens=[]) and peak == 4


# ---- the server's scheduler (tallow serve's BatchWorker), without HTTP ----------------------------
def _serve_run(model, requests, max_batch, cancel_after=None, join_later=()):
    """Run requests [(prompt ids, settings)] through a BatchWorker of max_batch; the ones in
    join_later are submitted once the first request has emitted 3 pieces. cancel_after: the
    index of a request cancelled as its 3rd piece is emitted. Returns (texts, outcomes, worker stats)."""
    import asyncio

    from tallow.serve.text import Generation
    from tallow.serve.workers import BatchWorker, Job

    async def main():
        loop = asyncio.get_running_loop()
        worker = BatchWorker("tiny", 16, model, max_batch)
        jobs = [None] * len(requests)

        class CancelledAtThird(Job):
            """Cancelled as its 3rd piece is emitted, in the worker's thread: a reader that sets
            the flag when it reads that piece can be too late on a busy box (a tiny model makes
            all 40 tokens before the event loop runs)."""
            def emit(self, event):
                super().emit(event)
                self.emitted = getattr(self, "emitted", 0) + 1
                if self.emitted == 3:
                    self.cancel.set()

        def submit(i):
            ids, settings = requests[i]
            jobs[i] = (CancelledAtThird if i == cancel_after else Job)(None, loop)
            jobs[i].task = Generation(model, ids, dict(settings), jobs[i])
            assert worker.submit(jobs[i])

        for i in range(len(requests)):
            if i not in join_later:
                submit(i)

        async def read(i):
            while jobs[i] is None:
                await asyncio.sleep(0.01)
            pieces = []
            while True:
                kind, value = await asyncio.wait_for(jobs[i].events.get(), 300)
                if kind != "event":
                    return "".join(pieces), kind
                pieces.append(value)
                if len(pieces) == 3 and i == 0:
                    for j in join_later:
                        submit(j)

        done = await asyncio.gather(*(read(i) for i in range(len(requests))))
        worker.stop()
        return [t for t, _ in done], [k for _, k in done], dict(worker.stats), [j.tokens for j in jobs]
    return asyncio.run(main())


def test_the_servers_scheduler_batches_joins_and_drops_requests(tmp_path):
    """Requests joining a running batch, one cancelled mid-way (it leaves at once), seeded
    sampling and a stop string: each gets what it gets with --max-batch 1. (This tiny model's
    float products step each sequence alone: the scheduler's bookkeeping is what is checked
    here; test_serve.py's eight streams batch SmolLM2's rows for real.)"""
    pytest.importorskip("starlette")
    from tiny_llama import save_tiny_llama
    save_tiny_llama(tmp_path, ["hello world, the quick brown fox jumps over the lazy dog"] * 8)
    model = tallow.load_model(tmp_path, device="cpu")
    greedy = dict(temperature=0.0, top_p=1.0, seed=None, stop=[], max_tokens=40)
    texts = ["hello", "the quick brown", "fox jumps", "over the lazy dog", "world"]
    requests = [(model.tokenizer.encode(t), greedy) for t in texts]
    requests[3] = (requests[3][0], dict(greedy, temperature=1.0, top_p=0.9, seed=5))  # sampled, seeded
    requests[4] = (requests[4][0], dict(greedy, stop=["do"]))  # (this random model says "doov" on the way)
    alone, _, one_stats, alone_tokens = _serve_run(model, requests, max_batch=1)
    assert one_stats["peak_batch"] == 1 and alone_tokens[4] < 40  # the stop string ended it
    got, outcomes, stats, tokens = _serve_run(model, requests, max_batch=4, cancel_after=1, join_later=(3, 4))
    assert outcomes == ["done", "error", "done", "done", "done"]  # the cancelled one ends with Cancelled
    assert [g for i, g in enumerate(got) if i != 1] == [a for i, a in enumerate(alone) if i != 1]
    assert got[1] and alone[1].startswith(got[1])  # what it got before it left is what it gets alone
    assert tokens[1] < 40 and stats["cancelled"] == 1 and stats["completed"] == 4
    assert stats["peak_batch"] >= 2
