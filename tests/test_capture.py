"""Capture and replay (tallow.capture; the one recording: tallow/backends/step_recording.py):
a captured one-token decode step replayed at later positions gives the logits eager decoding
gives, bit for bit, on wgpu (lavapipe) and on the CUDA and Metal kernels' CPU emulators, across
KV-cache growth and rotary-table growth; a captured step on the kernel backend holds at most 8
launches per layer, with the fused decode kernels; with the do-nothing driver the replays issue
the eager step's dispatches with no front end; shape changes fall back to eager; a step that
depends on the position outside the step buffer is refused."""
import pytest

import tallow
from tallow.errors import IndexRangeError, ShapeError, UnsupportedError

pytest.importorskip("transformers")
from tiny_llama import save_tiny_llama  # noqa: E402
from capture_counts import count_captures, is_emulated  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama")
    save_tiny_llama(folder, ["hello world, the quick brown fox"] * 8)
    return str(folder)



def _small_cache(model, capacity):
    cache = model.new_cache()
    for layer in cache.layers:
        layer.initial_capacity = capacity  # grows at capacity, 2 * capacity, ...: new buffers to recapture for
    return cache


def _greedy_logits(model, prompt, steps, cache):
    """Logits of every step of greedy decoding, one token per call after the prompt."""
    out = []
    logits = model(prompt, cache=cache, last_only=True).reshape(-1).tolist()
    for _ in range(steps):
        out.append(logits)
        token = max(range(len(logits)), key=logits.__getitem__)
        logits = model([token], cache=cache, last_only=True).reshape(-1).tolist()
    return out



@pytest.mark.emulated_model
def test_replayed_decode_gives_eager_logits_across_cache_growth(capture_device, tiny_llama_dir, monkeypatch,
                                                                request):
    model = tallow.load_model(tiny_llama_dir, device=capture_device)
    calls = count_captures(monkeypatch, capture_device.backend)
    # 70 steps: the KV cache grows at 8, 16, 32 and 64 positions and the rotary table at 64;
    # on an emulator (slow) 12 steps from a cache of 4: growth at 4, 8 and 16.
    emulator = is_emulated(request)
    steps, capacity = (12, 4) if emulator else (70, 8)
    captured = _greedy_logits(model, [1, 5, 9], steps, _small_cache(model, capacity))
    model.capture_decode = False
    eager = _greedy_logits(model, [1, 5, 9], steps, _small_cache(model, capacity))
    assert captured == eager
    assert calls["replay"] >= (5 if emulator else 50), calls  # most steps were replays ...
    assert calls["capture"] <= (6 if emulator else 12), calls  # ... after two captures per growth


def test_split_k_attention_replays_give_eager_logits_and_numpy_tokens(wgpu, tiny_llama_dir, monkeypatch):
    """Split-K attention (forced onto small caches: 4 keys per split) under capture: the split count
    follows the cache's capacity, so one recording replays at every position of it."""
    from tallow.generation import generate_ids
    from tallow_wgpu import attention
    monkeypatch.setattr(attention, "SPLIT_K_MIN_KEYS", 8)
    monkeypatch.setattr(attention, "KEYS_PER_SPLIT", 4)
    model = tallow.load_model(tiny_llama_dir, device=wgpu)
    calls = count_captures(monkeypatch, wgpu.backend)
    captured = _greedy_logits(model, [1, 5, 9], 30, _small_cache(model, 8))
    assert calls["replay"] >= 20, calls
    model.capture_decode = False
    assert captured == _greedy_logits(model, [1, 5, 9], 30, _small_cache(model, 8))
    model.capture_decode = True
    cpu = tallow.load_model(tiny_llama_dir, device="cpu")
    want = list(generate_ids(cpu, [7, 3, 3, 2, 11], max_tokens=24, stop_tokens=[]))
    assert list(generate_ids(model, [7, 3, 3, 2, 11], max_tokens=24, stop_tokens=[])) == want


@pytest.mark.emulated_model
def test_generate_replays_and_matches_numpy(capture_device, tiny_llama_dir, monkeypatch, request):
    from tallow.generation import generate_ids
    gpu = tallow.load_model(tiny_llama_dir, device=capture_device)
    cpu = tallow.load_model(tiny_llama_dir, device="cpu")
    calls = count_captures(monkeypatch, capture_device.backend)
    tokens = 8 if is_emulated(request) else 12
    for prompt in ([1, 5, 9], [7, 3, 3, 2, 11]):
        want = list(generate_ids(cpu, prompt, max_tokens=tokens, stop_tokens=[]))
        assert list(generate_ids(gpu, prompt, max_tokens=tokens, stop_tokens=[])) == want
    assert calls["replay"] > 0


@pytest.mark.parametrize("emulator", ["cuda-emulator", "metal-emulator"])
def test_kernel_backend_step_launches_per_layer(tmp_path, emulator):
    """One captured decode step's launches (kernels, and the emulated CUDA's numpy matmuls that
    stand in for cuBLAS) per Llama layer: residual add + norm, q/k/v, rope + KV write,
    attention, o_proj, residual add + norm, gate/up + SwiGLU, down. Without the fused kernels
    (base.py's compositions) a layer takes 15."""
    from conftest import DEVICES, emulated
    from tallow.device import restore_backend, use_backend
    name = DEVICES[emulator][0]
    dev = use_backend(name, emulated(emulator))
    try:
        entries = {}
        for layers in (2, 4):
            folder = tmp_path / f"llama{layers}"
            folder.mkdir()
            save_tiny_llama(folder, ["hello world, the quick brown fox"] * 8, num_hidden_layers=layers)
            model = tallow.load_model(str(folder), device=dev)
            cache = model.new_cache()
            model([1, 2, 3], cache=cache, last_only=True)
            with tallow.capture(dev, position=cache.length) as graph:
                graph.output(model(graph.input([[4]], tallow.i64), cache=cache, last_only=True))
            entries[layers] = [e[2] if e[0] == "launch" else "host matmul" for e in graph.recording.entries]
    finally:
        restore_backend(name)
    per_layer = (len(entries[4]) - len(entries[2])) / 2
    assert per_layer == 8, entries[2]
    assert len(entries[2]) - 2 * per_layer <= 4, "outside the layers: embedding, final norm, head"
    fused = {"add_norm_f32": 4, "rope_kv_write_f32": 2, "attention_rows_step_f32": 2, "gated_matvec_f32": 2}
    assert {k: entries[2].count(k) for k in fused} == fused, entries[2]


def test_null_driver_replays_the_eager_dispatches(null_wgpu, tiny_llama_dir):
    dev, driver = null_wgpu
    model = tallow.load_model(tiny_llama_dir, device=dev)
    counts = []
    for capture in (False, True):
        model.capture_decode = capture
        cache = model.new_cache()
        model([1, 2, 3], cache=cache, last_only=True)
        for _ in range(4):
            driver.reset_counts()
            model([4], cache=cache, last_only=True).tolist()
        counts.append((driver.dispatches, driver.replays, dict(driver.by_kernel)))
    (eager, eager_replays, eager_kernels), (replayed, replays, kernels) = counts
    assert (eager_replays, replays) == (0, 1)
    # The replay launches the recorded step plus one copy of the logits out of the graph.
    assert replayed == eager + 1, (eager_kernels, kernels)


def test_shape_changes_run_eagerly(null_wgpu, tiny_llama_dir):
    dev, driver = null_wgpu
    model = tallow.load_model(tiny_llama_dir, device=dev)
    cache = model.new_cache()
    model([1, 2, 3], cache=cache)
    for _ in range(3):
        model([4], cache=cache)
    assert cache.graph is not None
    driver.reset_counts()
    assert model([5, 6], cache=cache).shape[1] == 2  # a two-token step: eager
    assert driver.replays == 0 and cache.length == 8
    assert model([[5], [6]]).shape[0] == 2  # a batch of two (on the model's own cache): eager
    assert driver.replays == 0
    model([7], cache=cache)
    assert driver.replays == 1 and cache.length == 9


def test_bad_token_ids_are_refused_before_a_replay(null_wgpu, tiny_llama_dir):
    dev, _ = null_wgpu
    model = tallow.load_model(tiny_llama_dir, device=dev)
    model([1, 2])
    for _ in range(3):
        model([3])
    vocab = model.config.vocab_size
    with pytest.raises(IndexRangeError, match=f"id {vocab} is out of range"):
        model([vocab])
    with pytest.raises(IndexRangeError):
        model([-1])


def test_graph_replays_new_inputs_and_returns_fresh_outputs(wgpu):
    table = tallow.tensor([[float(10 * r + c) for c in range(4)] for r in range(6)], device=wgpu)
    with tallow.capture(wgpu, position=0) as graph:
        ids = graph.input([[2]], tallow.i64)
        first = graph.output(tallow.functional.embedding(ids, table) * 2.0)
    assert first.tolist() == [[[40.0, 42.0, 44.0, 46.0]]]
    five, = graph.replay([[5]], position=1)
    three, = graph.replay([[3]], position=2)
    assert five.tolist() == [[[100.0, 102.0, 104.0, 106.0]]]  # kept: not overwritten by the next replay
    assert three.tolist() == [[[60.0, 62.0, 64.0, 66.0]]]
    with pytest.raises(ShapeError, match=r"captured with \(1, 1\)"):
        graph.replay([[1, 2]], position=3)


def test_position_dependence_outside_the_step_buffer_shows(null_wgpu):
    dev, _ = null_wgpu
    x = tallow.zeros(8, 4, device=dev)
    graphs = []
    for position in (2, 3):
        with tallow.capture(dev, position=position) as graph:
            graph.output(x.narrow(0, position, 1) + 1.0)  # reads row `position`: not from the step buffer
        graphs.append(graph)
    with tallow.capture(dev, position=4) as same:
        same.output(x.narrow(0, 2, 1) + 1.0)
    assert not graphs[0].same_launches(graphs[1])
    assert graphs[0].same_launches(same)


def test_devices_without_capture_refuse_it():
    # (the cpu device captures once its numba kernels are in use: tests/test_cpu_capture.py)
    assert not tallow.can_capture("python")
    with pytest.raises(UnsupportedError, match="cannot capture"):
        tallow.capture("python")


@pytest.mark.slow
def test_smollm2_captured_decode_matches_eager(wgpu, smollm2_gguf, monkeypatch):
    from tallow.generation import chat_prompt_ids, generate_ids
    model = tallow.load_model(smollm2_gguf, device=wgpu)
    calls = count_captures(monkeypatch, wgpu.backend)
    for prompt in ("What is the capital of France?", "Write a haiku about the sea."):
        ids = chat_prompt_ids(model, [{"role": "user", "content": prompt}])
        model.capture_decode = True
        captured = list(generate_ids(model, ids, max_tokens=16, stop_tokens=[], cache=model.new_cache()))
        model.capture_decode = False
        eager = list(generate_ids(model, ids, max_tokens=16, stop_tokens=[], cache=model.new_cache()))
        assert captured == eager, f"{prompt!r}: {model.tokenizer.decode(captured)!r} vs {model.tokenizer.decode(eager)!r}"
    assert calls["replay"] >= 2 * 12, calls


def test_another_threads_ops_stay_out_of_a_capture(null_wgpu):
    import threading
    dev, driver = null_wgpu
    x = tallow.zeros(4, device=dev)
    with tallow.capture(dev, position=0) as graph:
        other = threading.Thread(target=lambda: (x + 1.0, x - 1.0))
        other.start()
        other.join()
        graph.output(x * 2.0)
    driver.reset_counts()
    graph.replay(position=1)
    # the scalar's fill and the mul, then the copy of the output: none of the other thread's add and sub
    assert driver.by_kernel == {"fill f32": 1, "mul": 1, "identity": 1}


def test_a_step_that_reads_the_position_elsewhere_decodes_eagerly(wgpu, tmp_path):
    # Phi-2's partial rotary runs its own rope and kv_write, whose parameters hold the position:
    # the two captures differ, so the cache stops capturing and decodes eagerly, with the same logits.
    import torch
    import transformers as tf
    torch.manual_seed(0)
    cfg = tf.PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=64, partial_rotary_factor=0.5)
    tf.PhiForCausalLM(cfg).eval().save_pretrained(tmp_path, safe_serialization=True)
    model = tallow.load_model(str(tmp_path), device=wgpu)
    cache = model.new_cache()
    captured = _greedy_logits(model, [1, 5, 9], 6, cache)
    assert cache.capture_refused and cache.graph is None
    model.capture_decode = False
    assert captured == _greedy_logits(model, [1, 5, 9], 6, model.new_cache())


@pytest.mark.parametrize("emulator", ["cuda-emulator", "metal-emulator"])
def test_rows_looked_up_on_the_host_are_never_replayed(emulator):
    # Q5_0 rows are dequantised on the host by the kernel backend (no kernel reads Q5_0): looked up by
    # the step's own ids, a replay would repeat the first step's rows. Q8_0 rows come from a kernel.
    import numpy as np
    from conftest import DEVICES, emulated
    from tallow.device import restore_backend, use_backend
    gguf = pytest.importorskip("gguf")
    name = DEVICES[emulator][0]
    dev = use_backend(name, emulated(emulator))
    try:
        w = np.random.default_rng(5).standard_normal((6, 32)).astype(np.float32)
        graphs = {}
        for qtype in ("q5_0", "q8_0"):
            kind = gguf.GGMLQuantizationType[qtype.upper()]
            table = tallow.from_buffer(gguf.quants.quantize(w, kind).tobytes(), qtype, w.shape, device=dev)
            for position in (1, 2):
                with tallow.capture(dev, position=position) as graph:
                    ids = graph.input([[position]], tallow.i64)
                    graph.output(tallow.functional.embedding(ids, table) * 1.0)
                graphs[qtype, position] = graph
        assert not graphs["q5_0", 1].same_launches(graphs["q5_0", 2])
        with pytest.raises(UnsupportedError, match="q5_0 rows looked up on the host"):
            graphs["q5_0", 2].replay([[4]], position=3)
        assert graphs["q8_0", 1].same_launches(graphs["q8_0", 2])
        row, = graphs["q8_0", 2].replay([[4]], position=3)
        want = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.GGMLQuantizationType.Q8_0)[4]
        np.testing.assert_allclose(row.numpy().reshape(-1), want, rtol=1e-6)
    finally:
        restore_backend(name)


def test_i64_arithmetic_on_the_host_is_never_replayed_on_wgpu(wgpu):
    # wgpu keeps i64 as i32, so an i64 add runs exactly on the host from the step's own ids: a replay
    # would upload the first step's sum again. Both backends share the recording that refuses it.
    graphs = []
    for position in (1, 2):
        with tallow.capture(wgpu, position=position) as graph:
            ids = graph.input([[position]], tallow.i64)
            graph.output(ids + ids)
        graphs.append(graph)
    assert graphs[1].results()[0].tolist() == [[4]]
    assert not graphs[0].same_launches(graphs[1])
    with pytest.raises(UnsupportedError, match="binary add .*exactly on the host"):
        graphs[1].replay([[7]], position=3)
