"""Capture and replay on the numpy CPU device (core/backends/cpu/runtime/capture.py): once the numba
kernels are in use, a one-token decode step's kernel calls are recorded and replayed with no op
front end. Replays give the eager logits bit for bit (across KV-cache growth, with the thread
pool sharing products); a step with any primitive the CPU path does not record decodes eagerly;
replayed ids and positions are checked; every compute primitive of the contract is either
recorded or guarded."""
import os
import sys

import numpy as np
import pytest

import tallow
from tallow.backends.cpu.runtime import capture
from tallow.backends.base import Backend
from tallow.errors import IndexRangeError, ShapeError, UnsupportedError

pytest.importorskip("numba")
gguf = pytest.importorskip("gguf")
from capture_counts import count_captures  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_synthetic_gguf as maker  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """2 layers, 448 wide, q/k/v biases, 7 query heads on 1 KV head; Q5_0, Q8_0, Q4_K and Q6_K blocks."""
    path = tmp_path_factory.mktemp("qwen2") / "qwen2-tiny.gguf"
    maker.write(path, "qwen2", "q4_k_m", scale=1 / 32, layers=2, seed=5)
    return str(path)


def _small_cache(model, capacity):
    cache = model.new_cache()
    for layer in cache.layers:
        layer.initial_capacity = capacity
    return cache


def _greedy_logits(model, prompt, steps, cache):
    out = []
    logits = model(prompt, cache=cache, last_only=True).numpy().reshape(-1)
    for _ in range(steps):
        out.append(logits)
        logits = model([int(logits.argmax())], cache=cache, last_only=True).numpy().reshape(-1)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("program", [True, False], ids=["one-program", "calls"])
def test_cpu_replays_give_eager_logits_across_cache_growth(tiny_qwen2, monkeypatch, threads, program):
    """Replays as one numba program on every thread (backends/cpu/kernels/step_loop.py), or call by call."""
    from tallow.backends.cpu.runtime import kernel_calls
    if threads > 1:
        monkeypatch.setattr(kernel_calls, "PARALLEL_MIN_BYTES", 0)  # every product shared by the threads
    monkeypatch.setenv("TALLOW_CPU", "auto" if program else "replay")
    kernel_calls.set_threads(threads)
    try:
        model = tallow.load_model(tiny_qwen2, device="cpu")
        model([1, 2])  # the first quantised product loads the kernels: the device captures from here
        assert tallow.can_capture("cpu")
        calls = count_captures(monkeypatch, model.device.backend)
        cache = _small_cache(model, 8)
        captured = _greedy_logits(model, [5, 9, 13], 40, cache)  # grows at 8, 16, 32
        assert bool(cache.graph[0].recording.handle[0]) == program  # (made at the first replay)
        model.capture_decode = False
        eager = _greedy_logits(model, [5, 9, 13], 40, _small_cache(model, 8))
    finally:
        kernel_calls.set_threads(kernel_calls.thread_count())
    assert all((a == b).all() for a, b in zip(captured, eager))
    assert calls["replay"] >= 25, calls
    assert calls["capture"] <= 8, calls


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """Gemma 3 shape, 6 layers (5 sliding-window layers of window 6, then a global one), q/k norms,
    norms after attention and the MLP, the embedding scaled by sqrt(width)."""
    path = tmp_path_factory.mktemp("gemma3") / "gemma3-tiny.gguf"
    arch = dict(maker.ARCHS["gemma3-270m"], window=6)
    saved = maker.ARCHS["gemma3-270m"]
    maker.ARCHS["gemma3-270m"] = arch
    try:
        maker.write(path, "gemma3-270m", "q4_k_m", scale=0.2, layers=6, seed=3, vocab=512)
    finally:
        maker.ARCHS["gemma3-270m"] = saved
    return str(path)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("program", [True, False], ids=["one-program", "calls"])
def test_sliding_window_steps_replay_and_slide_the_window(tiny_gemma3, monkeypatch, threads, program):
    """Gemma 3's sliding-window layers capture on the cpu device (Backend.captures_windows): the
    recorded attention slides its first key with the step buffer's position, so replays past the
    window (6) and across cache growth give the eager logits bit for bit."""
    from tallow.backends.cpu.runtime import kernel_calls
    if threads > 1:
        monkeypatch.setattr(kernel_calls, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TALLOW_CPU", "auto" if program else "replay")
    kernel_calls.set_threads(threads)
    try:
        model = tallow.load_model(tiny_gemma3, device="cpu")
        assert {model.config.window(kind) for kind in model.config.layer_types} == {6, None}
        model([1, 2])
        calls = count_captures(monkeypatch, model.device.backend)
        cache = _small_cache(model, 8)
        captured = _greedy_logits(model, [5, 9, 13], 36, cache)  # the window passed at 6, growth at 8, 16, 32
        assert bool(cache.graph[0].recording.handle[0]) == program
        model.capture_decode = False
        eager = _greedy_logits(model, [5, 9, 13], 36, _small_cache(model, 8))
    finally:
        kernel_calls.set_threads(kernel_calls.thread_count())
    assert all((a == b).all() for a, b in zip(captured, eager))
    assert calls["replay"] >= 18, calls


def test_a_window_is_said_only_for_one_query_at_its_key_start(tiny_gemma3):
    """functional.cache_attention's window: one query whose key_start is max(0, position + 1 - window)."""
    import tallow.functional as F
    q = tallow.ones(1, 1, 2, 4, device="cpu")
    kc, vc = tallow.zeros(1, 1, 16, 4, device="cpu"), tallow.zeros(1, 1, 16, 4, device="cpu")
    one = q.narrow(2, 0, 1)
    F.cache_attention(one, one, one, kc, vc, 9, key_start=4, window=6)
    with pytest.raises(ShapeError, match="window=6 is for one query"):
        F.cache_attention(one, one, one, kc, vc, 9, key_start=3, window=6)
    with pytest.raises(ShapeError, match="got 2 queries"):
        F.cache_attention(q, q, q, kc, vc, 9, key_start=4, window=6)


def test_generate_on_cpu_replays_and_matches_eager(tiny_qwen2, monkeypatch):
    from tallow.generation import generate_ids
    model = tallow.load_model(tiny_qwen2, device="cpu")
    model([1, 2])
    calls = count_captures(monkeypatch, model.device.backend)
    captured = list(generate_ids(model, [7, 3, 3, 2, 11], max_tokens=20, stop_tokens=[], cache=model.new_cache()))
    assert calls["replay"] >= 15, calls
    model.capture_decode = False
    assert captured == list(generate_ids(model, [7, 3, 3, 2, 11], max_tokens=20, stop_tokens=[],
                                         cache=model.new_cache()))


def test_a_reset_cache_replays_its_captured_step_for_the_next_sequence(tiny_qwen2, monkeypatch):
    """reset() keeps the KV buffers and the captured step: the next prompt's decode steps all
    replay, and give the logits of a fresh cache decoding eagerly."""
    model = tallow.load_model(tiny_qwen2, device="cpu")
    model([1, 2])
    model.reset()
    _greedy_logits(model, [4, 4, 8], 6, model.cache)  # captures its first two steps
    model.reset()
    calls = count_captures(monkeypatch, model.device.backend)
    replayed = _greedy_logits(model, [5, 9, 13, 2, 7], 12, model.cache)
    assert calls == {"capture": 0, "replay": 12}, calls
    model.capture_decode = False
    eager = _greedy_logits(model, [5, 9, 13, 2, 7], 12, model.new_cache())
    assert all((a == b).all() for a, b in zip(replayed, eager))
    model.reset()  # another batch size after a reset gets buffers of its shape
    assert model([[1, 2], [3, 4]]).shape[:2] == (2, 2)


def _captured_step(model, cache, token):
    """A graph of one decode step on cache (advanced by one position), as CausalLM records it."""
    position = cache.length
    with tallow.capture("cpu", position=position) as graph:
        ids = graph.input([[token]])
        graph.output(model(ids, cache=cache, last_only=True))
    return graph


def test_replayed_ids_and_positions_are_checked(tiny_qwen2):
    model = tallow.load_model(tiny_qwen2, device="cpu")
    cache = _small_cache(model, 8)
    model([5, 9, 13], cache=cache)
    graph = _captured_step(model, cache, 4)
    assert not graph.recording.host_computed
    vocab = model.config.vocab_size
    with pytest.raises(IndexRangeError, match=f"id {vocab} is out of range"):
        graph.replay([[vocab]], position=4)
    with pytest.raises(IndexRangeError, match="id -1 is out of range"):
        graph.replay([[-1]], position=4)
    with pytest.raises(ShapeError, match="needs 9 cache slots, the cache has 8"):
        graph.replay([[3]], position=8)
    graph.replay([[3]], position=4)  # still fine after the refusals


def test_a_step_with_unrecorded_ops_is_never_replayed(tiny_qwen2):
    model = tallow.load_model(tiny_qwen2, device="cpu")
    model([1, 2])
    x = tallow.ones(4, device="cpu")
    with tallow.capture("cpu", position=0) as graph:
        graph.output(x.cumsum(0))  # numpy's cumsum: not a recorded kernel call
    assert graph.recording.host_computed
    with pytest.raises(UnsupportedError, match="run it eagerly"):
        graph.replay(position=1)


def test_a_float_model_decodes_eagerly_on_cpu(tmp_path, tiny_qwen2):
    # f32 weights take numpy's matmul, which the CPU capture does not record: the cache refuses
    # capture after two steps and decodes eagerly, with the eager logits.
    pytest.importorskip("transformers")
    from tiny_llama import save_tiny_llama
    tallow.load_model(tiny_qwen2, device="cpu")([1, 2])  # the kernels in use: the device captures
    save_tiny_llama(tmp_path, ["hello world, the quick brown fox"] * 8)
    model = tallow.load_model(str(tmp_path), device="cpu")
    cache = model.new_cache()
    captured = _greedy_logits(model, [1, 5, 9], 6, cache)
    assert cache.capture_refused and cache.graph is None
    model.capture_decode = False
    assert all((a == b).all() for a, b in zip(captured, _greedy_logits(model, [1, 5, 9], 6, model.new_cache())))


# Backend methods that are not compute: reads, new storages from host data, capture, helpers.
NOT_COMPUTE = {"features", "can_capture", "begin_capture", "end_capture", "replay", "overwrite", "from_bytes",
               "batch_rows", "to_bytes", "from_list", "to_list", "to_numpy", "from_js_buffer", "captures_windows"}


def test_every_compute_primitive_is_recorded_or_guarded():
    """A primitive added to the contract must be listed, or a capture could skip it silently."""
    names = {n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")}
    assert names - NOT_COMPUTE == set(capture.COMPUTE_PRIMITIVES)


def test_other_threads_ops_stay_out_of_a_cpu_capture(tiny_qwen2):
    import threading
    model = tallow.load_model(tiny_qwen2, device="cpu")
    cache = _small_cache(model, 16)
    model([5, 9, 13], cache=cache)
    x = tallow.ones(4, device="cpu")
    with tallow.capture("cpu", position=cache.length) as graph:
        other = threading.Thread(target=lambda: x + 1.0)  # unrecorded, but not this thread's
        other.start()
        other.join()
        ids = graph.input([[4]])
        graph.output(model(ids, cache=cache, last_only=True))
    assert not graph.recording.host_computed
    first = graph.results()[0].numpy()
    (again,) = graph.replay([[4]], position=3)  # the same token at the same position: the same logits
    np.testing.assert_array_equal(again.numpy(), first)


STEP_FORM_CHILD = """
import numpy as np
from tallow.backends.cpu.kernels import machine_code
from tallow.backends.cpu.kernels.codes import OP_CALL
from tallow.backends.cpu.runtime import kernel_calls, step_program
kernel_calls.kernels()
dec = kernel_calls.decode_kernels()
rng = np.random.default_rng(3)
x, r = (rng.standard_normal((3, 40)).astype(np.float32) for _ in range(2))
w = rng.standard_normal(40).astype(np.float32)
total, normed = np.zeros_like(x), np.zeros_like(x)
program = step_program.build([(dec.add_rms_norm, (x, r, w, 1e-5, total, normed))])
assert [int(c) for c in program.prog[:, 0]] == [OP_CALL], program.prog
program.run()
want = np.zeros_like(x), np.zeros_like(x)
machine_code.numba_kernel("add_rms_norm")(x, r, w, 1e-5, *want)
assert (total == want[0]).all() and (normed == want[1]).all()
assert step_program.build([(dec.add_rms_norm, (x, r, w, 1e-5, total, normed[:, ::2]))]) is None  # (not contiguous)
print("native" if machine_code.kernel("add_rms_norm_step") is not None else "in-process")
"""


@pytest.mark.parametrize("cpu", ["auto", pytest.param("numba", marks=pytest.mark.slow)])
def test_a_kernel_declared_with_a_step_form_runs_inside_the_step_program(cpu):
    # add_rms_norm is declared `@entry(..., step=True)` in kernels/fused_ops.py and nowhere else: its
    # recorded call becomes an OP_CALL row calling its step form, which computes what the kernel does.
    # TALLOW_CPU=numba compiles the step form in the process instead of loading its machine code.
    import subprocess
    env = dict(os.environ, TALLOW_CPU=cpu)
    out = subprocess.run([sys.executable, "-c", STEP_FORM_CHILD], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == ("native" if cpu == "auto" else "in-process")
