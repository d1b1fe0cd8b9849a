"""Whisper's decoder steps captured and replayed (tallow.step_capture, as CausalLM decodes):
on wgpu (lavapipe) and on the CUDA and Metal kernels' CPU emulators a tiny random-weight
Whisper gives the eager logits bit for bit, greedy and with beams reordered in place, across
KV-cache growth; with the do-nothing driver the
replays happen and issue the eager step's kernels; shape changes (a prompt, a new batch, a
new window) fall back to eager; bad ids and a full context are refused before a replay; the
real tiny.en transcribes jfk.wav to the same sentence captured."""
import pytest

import tallow
from tallow.errors import IndexRangeError, ShapeError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from tallow.models import whisper  # noqa: E402
from capture_counts import count_captures, is_emulated  # noqa: E402

MELS, FRAMES, VOCAB = 8, 16, 100
PROMPT = [1, 5, 7]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_whisper")
    torch.manual_seed(3)
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=MELS, d_model=32, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=FRAMES // 2, max_target_positions=40, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1)
    transformers.WhisperForConditionalGeneration(cfg).save_pretrained(folder, safe_serialization=True)
    return folder




def _state(model, features, capacity):
    state = model.start(features)
    for cache in state.caches:
        cache.initial_capacity = capacity  # grows at capacity, 2 * capacity: new buffers to capture again
    return state


def _features(model, seed):
    torch.manual_seed(seed)
    return model.encode(tallow.tensor(torch.randn(1, MELS, FRAMES).tolist()))


def _greedy(model, features, steps, capacity=4):
    """Every step's logits of greedy decoding, one token per call after the prompt."""
    state = _state(model, features, capacity)
    logits = model.decode_step([PROMPT], state).reshape(-1).tolist()
    out = []
    for _ in range(steps):
        out.append(logits)
        token = max(range(VOCAB), key=logits.__getitem__)
        logits = model.decode_step([[token]], state).reshape(-1).tolist()
    return out


def _beams(model, features, steps, beams=3, capacity=4):
    """Beam-search-shaped decoding: the prompt's cache row copied per beam, then each step
    keeps, for beam k, the best continuation of beam (k + step) % beams (a reorder per step)."""
    state = _state(model, features, capacity)
    model.decode_step([PROMPT], state)
    state.reorder([0] * beams)
    seqs, out = [[PROMPT[-1]] for _ in range(beams)], []
    for step in range(steps):
        logits = model.decode_step([[s[-1]] for s in seqs], state).reshape(beams, -1).tolist()
        out.append(logits)
        sources = [(k + step) % beams for k in range(beams)]
        state.reorder(sources)
        seqs = [seqs[src] + [sorted(range(VOCAB), key=logits[src].__getitem__)[-1 - k]]
                for k, src in enumerate(sources)]
    return out, seqs


@pytest.mark.emulated_model
def test_captured_greedy_decode_gives_eager_logits_across_cache_growth(capture_device, tiny_dir, monkeypatch,
                                                                       request):
    model = whisper.load(tiny_dir, device=capture_device)
    feats = _features(model, 0)
    calls = count_captures(monkeypatch, capture_device.backend)
    # 30 steps: the KV cache grows at 4, 8, 16 and 32 positions (new buffers: capture again);
    # on an emulator (slow) 10 steps: growth at 4 and 8.
    emulator = is_emulated(request)
    steps = 10 if emulator else 30
    captured = _greedy(model, feats, steps)
    model.capture_decode = False
    assert captured == _greedy(model, feats, steps)
    assert calls["replay"] >= (3 if emulator else 14), calls
    assert calls["capture"] <= 8, calls


def test_split_k_self_attention_replays_give_eager_logits(wgpu, tiny_dir, monkeypatch):
    """The decoder's self-attention split among workgroups (forced onto small caches) under capture."""
    from tallow_wgpu import attention
    monkeypatch.setattr(attention, "SPLIT_K_MIN_KEYS", 8)
    monkeypatch.setattr(attention, "KEYS_PER_SPLIT", 2)
    model = whisper.load(tiny_dir, device=wgpu)
    feats = _features(model, 1)
    calls = count_captures(monkeypatch, wgpu.backend)
    captured = _greedy(model, feats, 20, capacity=8)
    assert calls["replay"] >= 10, calls
    model.capture_decode = False
    assert captured == _greedy(model, feats, 20, capacity=8)


@pytest.mark.emulated_model
def test_captured_beams_reordered_in_place_give_eager_logits(capture_device, tiny_dir, monkeypatch, request):
    model = whisper.load(tiny_dir, device=capture_device)
    feats = _features(model, 1)
    calls = count_captures(monkeypatch, capture_device.backend)
    steps = 5 if is_emulated(request) else 10
    captured = _beams(model, feats, steps, capacity=16)
    model.capture_decode = False
    assert captured == _beams(model, feats, steps, capacity=16)
    assert calls["replay"] >= steps - 3, calls  # the beams' reorders keep the buffers: every step after two replays
    # and the in-place reorder on the GPU keeps the rows numpy keeps
    cpu = whisper.load(tiny_dir, device="cpu")
    logits, seqs = _beams(cpu, _features(cpu, 1), steps, capacity=16)
    assert seqs == captured[1]
    assert max(abs(a - b) for step, want in zip(captured[0], logits) for row, ref in zip(step, want)
               for a, b in zip(row, ref)) <= 1e-4


def test_null_driver_replays_the_eager_kernels(null_wgpu, tiny_dir):
    dev, driver = null_wgpu
    model = whisper.load(tiny_dir, device=dev)
    feats = model.encode(tallow.zeros(1, MELS, FRAMES, device=dev))
    counts = []
    for capture in (False, True):
        model.capture_decode = capture
        state = model.start(feats)
        model.decode_step([PROMPT], state)
        for _ in range(4):
            driver.reset_counts()
            model.decode_step([[9]], state).tolist()
        counts.append((driver.replays, dict(driver.by_kernel)))
    (eager_replays, eager), (replays, replayed) = counts
    assert (eager_replays, replays) == (0, 1)
    # The same kernels, plus the position embedding read from the step's input rather than
    # from a view at the position, and the copy of the logits out of the graph.
    assert {k: n for k, n in replayed.items() if eager.get(k) != n} == {
        "index_select": 2 * eager["index_select"], "identity": eager.get("identity", 0) + 1}, (eager, replayed)


def test_shape_changes_and_new_windows_capture_again(null_wgpu, tiny_dir):
    dev, driver = null_wgpu
    model = whisper.load(tiny_dir, device=dev)
    feats = model.encode(tallow.zeros(1, MELS, FRAMES, device=dev))
    state = model.start(feats)
    model.decode_step([PROMPT], state)
    for _ in range(3):
        model.decode_step([[4]], state)
    assert state.replays.graph is not None and driver.replays == 1
    driver.reset_counts()
    assert model.decode_step([[5, 6]], state).shape == (1, 1, VOCAB)  # two tokens: eager
    assert driver.replays == 0 and state.length == 8
    state.reorder([0, 0])  # two beams: new cache buffers, so eager while capturing again
    for _ in range(2):
        assert model.decode_step([[4], [5]], state).shape == (2, 1, VOCAB)
    assert driver.replays == 0
    model.decode_step([[4], [5]], state)
    state.reorder([1, 0])  # the same batch: rewritten in place, the capture stays
    model.decode_step([[4], [5]], state)
    assert driver.replays == 2 and state.length == 12
    window = model.start(feats)  # a new window: its own caches and capture
    model.decode_step([PROMPT], window)
    model.decode_step([[4]], window)
    assert driver.replays == 2 and window.replays.pending is not None


def test_bad_ids_and_a_full_context_are_refused_before_a_replay(null_wgpu, tiny_dir):
    dev, _ = null_wgpu
    model = whisper.load(tiny_dir, device=dev)
    state = model.start(model.encode(tallow.zeros(1, MELS, FRAMES, device=dev)))
    model.decode_step([PROMPT], state)
    for _ in range(3):
        model.decode_step([[4]], state)
    with pytest.raises(IndexRangeError, match=f"token id {VOCAB} is out of range"):
        model.decode_step([[VOCAB]], state)
    with pytest.raises(IndexRangeError, match="token id -1"):
        model.decode_step([[-1]], state)
    while state.length < model.config.max_target_positions:
        model.decode_step([[4]], state)
    with pytest.raises(ShapeError, match="41 tokens is more than the model's 40 positions"):
        model.decode_step([[4]], state)


@pytest.mark.slow
def test_tiny_en_transcribes_jfk_the_same_captured(wgpu, whisper_tiny_dir, jfk_wav, monkeypatch):
    sentence = ("And so my fellow Americans ask not what your country can do for you, "
                "ask what you can do for your country.")
    model = whisper.load(whisper_tiny_dir, device=wgpu)
    calls = count_captures(monkeypatch, wgpu.backend)
    captured = model.transcribe(str(jfk_wav), temperature=0.0, timestamps=False)
    assert captured.text.strip() == sentence
    assert calls["replay"] >= 15, calls  # eager, it is the same sentence: tests/test_wgpu_models.py


def test_beam_search_decode_replays_with_reordered_beams(null_wgpu, whisper_tiny_dir):
    # decode()'s beam search reorders the beams' cache rows every step: in place, so the
    # captured step keeps replaying (the null driver's logits are zeros: this counts, not reads).
    from tallow.models.whisper_decoding import DecodingOptions, decode
    dev, driver = null_wgpu
    model = whisper.load(whisper_tiny_dir, device=dev)
    feats = model.encode(tallow.zeros(1, model.config.num_mel_bins, 3000, device=dev))
    decode(model, feats, DecodingOptions(beam_size=3, sample_len=12, without_timestamps=True, suppress_blank=False))
    assert driver.replays >= 8


@pytest.mark.emulated_model  # test_capture.py counts the LLM step's launches on an emulator in the fast loop
@pytest.mark.parametrize("emulator", ["cuda-emulator", "metal-emulator"])
def test_kernel_backend_decoder_step_launches_per_layer(tmp_path, emulator):
    """One captured Whisper decoder step's launches per layer on the kernel backend: residual
    add + layer norm (3 times), q/k/v as one matvec with its biases, the KV-cache write, 2
    attentions, the cross-attention's q, 2 output projections, fc1, gelu, fc2 (every bias
    inside its matvec): 13, as on wgpu (tests/test_dispatch_counts.py)."""
    from conftest import DEVICES, emulated
    from tallow.device import restore_backend, use_backend
    name = DEVICES[emulator][0]
    dev = use_backend(name, emulated(emulator))
    try:
        entries = {}
        for layers in (2, 4):
            folder = tmp_path / f"whisper{layers}"
            cfg = transformers.WhisperConfig(
                vocab_size=VOCAB, num_mel_bins=MELS, d_model=32, encoder_layers=1, decoder_layers=layers,
                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_source_positions=FRAMES // 2, max_target_positions=16, decoder_start_token_id=1, pad_token_id=0,
                eos_token_id=2, bos_token_id=1)
            transformers.WhisperForConditionalGeneration(cfg).save_pretrained(folder, safe_serialization=True)
            model = whisper.load(folder, device=dev)
            state = model.start(model.encode(tallow.zeros(1, MELS, FRAMES, device=dev)))
            model.decode_step([PROMPT], state)
            for _ in range(2):  # the second step is captured and confirmed: later ones replay it
                model.decode_step([[4]], state)
            graph = state.replays.graph[0]
            entries[layers] = [e[2] if e[0] == "launch" else "host call" for e in graph.recording.entries]
    finally:
        restore_backend(name)
    per_layer = (len(entries[4]) - len(entries[2])) / 2
    assert per_layer == 13, entries[2]
    assert len(entries[2]) - 2 * per_layer <= 6, "outside the layers: token and position embeddings, norm, logits"
    assert "host call" not in entries[2]  # all kernels: a CUDA graph on a GPU
    # every norm adds its residual: the first layer's adds the position rows to the token rows
    fused = {"add_norm_f32": 7, "kv_write_f32": 2, "attention_rows_step_f32": 2}
    assert {k: entries[2].count(k) for k in fused} == fused, entries[2]
