"""Dispatches per transformer layer in one-token decode on the GPU path, counted with the
do-nothing driver (wgpu_backend/driver_null.py), for a Llama-family decoder and for
Whisper's decoder. Host time per token grows with this count, so it is pinned here;
bench/gpu_host.py measures the time itself."""
import pytest

import tallow
from tallow.device import restore_backend, use_backend

pytest.importorskip("transformers")
from tallow_wgpu.backend import WgpuBackend  # noqa: E402
from tallow_wgpu.driver_null import NullDriver  # noqa: E402
from tiny_llama import save_tiny_llama  # noqa: E402

# Issue #13 item 2 took this from 20 to 5: residual add + input norm + q/k/v as one matvec
# (add_norm_linear), attention that rotates q and k and appends k and v to the KV cache itself
# (cache_attention), o_proj, residual add + post-attention norm + gate/up as one matvec with
# SwiGLU fused in, down.
MAX_DISPATCHES_PER_LAYER = 5
# Whisper's decoder layer, from 31 to 8: residual add + layer norm fused into the matvec after
# it (q/k/v as one; the cross-attention's q; fc1 with gelu), self-attention appending to its
# KV cache, cross-attention, 2 output projections, fc2 (every bias added inside its matvec).
MAX_WHISPER_DISPATCHES_PER_LAYER = 8


def _step_dispatches(load, first, step):
    """Dispatches (total, per kernel) of one decode step, `step(model, state)`, after `first`
    set up the state, for the model `load(device)` gives on the do-nothing driver."""
    driver = NullDriver()
    try:
        model = load(use_backend("wgpu", WgpuBackend(driver)))
        state = first(model)
        driver.reset_counts()
        step(model, state)
        return driver.dispatches, dict(driver.by_kernel)
    finally:
        restore_backend("wgpu")


def _per_layer(dispatches_for):
    """(per layer, outside the layers, kernels): from models of 2 and 4 layers."""
    two, _ = dispatches_for(2)
    four, kernels = dispatches_for(4)
    per_layer = (four - two) / 2
    assert per_layer == int(per_layer), "every layer issues the same dispatches"
    return per_layer, two - 2 * per_layer, kernels


def _decode_dispatches(tmp_path, layers):
    folder = tmp_path / f"llama{layers}"
    folder.mkdir()
    save_tiny_llama(folder, ["hello world, the quick brown fox"] * 8, num_hidden_layers=layers)

    def first(model):
        cache = model.new_cache()
        model([1, 2, 3], cache=cache, last_only=True).tolist()
        return cache
    return _step_dispatches(lambda dev: tallow.load_model(str(folder), device=dev), first,
                            lambda model, cache: model([4], cache=cache, last_only=True).tolist())


def test_decode_dispatches_per_layer_are_bounded(tmp_path):
    per_layer, outside, kernels = _per_layer(lambda layers: _decode_dispatches(tmp_path, layers))
    assert per_layer <= MAX_DISPATCHES_PER_LAYER, (per_layer, kernels)
    # Both norms ride in the projection after them (4 layers, the first without a residual add).
    assert kernels["rms_norm matvec"] == 4 and kernels["rms_norm gated matvec silu"] == 4, kernels
    assert outside <= 4, "outside the layers: embedding, final norm, head"


def _whisper_step_dispatches(tmp_path, layers):
    transformers = pytest.importorskip("transformers")
    from tallow.models import whisper
    folder = tmp_path / f"whisper{layers}"
    cfg = transformers.WhisperConfig(
        vocab_size=100, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=layers,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=8, max_target_positions=16, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1)
    transformers.WhisperForConditionalGeneration(cfg).save_pretrained(folder, safe_serialization=True)

    def first(model):
        state = model.start(model.encode(tallow.zeros(1, 8, 16, device=model.device)))
        model.decode_step([[1, 5, 7]], state).tolist()
        return state
    return _step_dispatches(lambda dev: whisper.load(folder, device=dev), first,
                            lambda model, state: model.decode_step([[9]], state).tolist())


def test_whisper_decoder_dispatches_per_layer_are_bounded(tmp_path):
    per_layer, outside, kernels = _per_layer(lambda layers: _whisper_step_dispatches(tmp_path, layers))
    assert per_layer <= MAX_WHISPER_DISPATCHES_PER_LAYER, (per_layer, kernels)
    # q/k/v and the cross-attention's q, then fc1 with its gelu, each with its layer norm (4 layers).
    assert kernels["layer_norm matvec"] == 8 and kernels["layer_norm matvec gelu"] == 4, kernels
    # The step is captured (wgpu captures one-token steps): the position embedding is a gather
    # of the step's position input, and the logits are copied out of the graph.
    assert outside <= 6, "outside the layers: token and position embeddings, norms, logits"


def test_split_k_attention_adds_one_dispatch_per_layer(tmp_path, monkeypatch):
    """Over a long KV cache wgpu splits the keys among workgroups (flash-decoding, forced here
    onto the tiny model's cache) and joins their partial softmaxes in one more dispatch."""
    from tallow_wgpu import attention
    monkeypatch.setattr(attention, "SPLIT_K_MIN_KEYS", 8)
    monkeypatch.setattr(attention, "KEYS_PER_SPLIT", 4)
    per_layer, _, kernels = _per_layer(lambda layers: _decode_dispatches(tmp_path, layers))
    assert per_layer == MAX_DISPATCHES_PER_LAYER + 1, (per_layer, kernels)
    assert kernels["attention_combine"] == kernels["cache_attention"] == 4, kernels


# Gemma 3's block, from 21 to 13: the input norm fused into q/k/v (one matvec), q and k head
# norms, rope, attention, o_proj, the post-attention norm, residual add + pre-feedforward norm
# fused into gate/up (one matvec, GeLU-tanh gate fused in), down, the post-feedforward norm
# and the residual add (its sandwich norms keep the adds apart).
MAX_GEMMA3_DISPATCHES_PER_LAYER = 13


def test_gemma3_decode_dispatches_per_layer_are_bounded(tmp_path):
    from test_llm_archs import _gemma3

    def dispatches_for(layers):
        _, path = _gemma3(tmp_path / f"gemma{layers}", num_hidden_layers=layers,
                          layer_types=["sliding_attention", "full_attention"] * (layers // 2))

        def first(model):
            cache = model.new_cache()
            model([1, 2, 3], cache=cache, last_only=True).tolist()
            return cache
        return _step_dispatches(lambda dev: tallow.load_model(str(path), device=dev), first,
                                lambda model, cache: model([4], cache=cache, last_only=True).tolist())
    per_layer, _, kernels = _per_layer(dispatches_for)
    assert per_layer <= MAX_GEMMA3_DISPATCHES_PER_LAYER, (per_layer, kernels)
