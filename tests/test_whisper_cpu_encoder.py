"""Whisper's numpy encoder path (tallow.models.whisper_cpu_encoder) against transformers'
encoder (full and short inputs, odd frame counts) and the generic encoder (q8_0 weights),
plus its refusals. Small random checkpoints: a few seconds in all."""
import numpy as np
import pytest
from test_whisper import _random_checkpoint

import tallow
from tallow.errors import ShapeError
from tallow.models import whisper
from tallow.models.whisper_cpu_encoder import CpuEncoder

POSITIONS = 30


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper_random_encoder")
    torch, ref = _random_checkpoint(path, 80, POSITIONS)
    return path, torch, ref


def _generic(model, mel):
    model.cpu_direct = False
    try:
        return model.encode(mel).numpy()
    finally:
        model.cpu_direct = True


@pytest.mark.parametrize("frames", [2 * POSITIONS, 2 * POSITIONS - 7])
def test_encoder_matches_transformers_and_the_generic_encoder(checkpoint, frames):
    path, torch, ref = checkpoint
    model = whisper.load(path, device="cpu")
    assert CpuEncoder.supports(model)
    torch.manual_seed(frames)
    feats = torch.randn(2, 80, frames)  # two audios in one batch
    mel = tallow.tensor(feats.tolist())
    got = model.encode(mel).numpy()
    assert got.shape == (2, (frames + 1) // 2, 64)
    assert abs(got - _generic(model, mel)).max() <= 1e-5
    if frames == 2 * POSITIONS:  # transformers accepts exactly 2 * max_source_positions frames
        with torch.no_grad():
            want = ref.model.encoder(feats).last_hidden_state.numpy()
        assert abs(got - want).max() <= 1e-4


def test_q8_0_encoder_matches_the_generic_encoder(checkpoint):
    path, torch, _ = checkpoint
    model = whisper.load(path, device="cpu", quantize="q8_0")
    assert CpuEncoder.supports(model)
    torch.manual_seed(1)
    mel = tallow.tensor(torch.randn(1, 80, 2 * POSITIONS).tolist())
    assert abs(model.encode(mel).numpy() - _generic(model, mel)).max() <= 1e-4


def test_other_activations_and_bad_mels(checkpoint):
    path, torch, _ = checkpoint
    model = whisper.load(path, device="cpu")
    with pytest.raises(ShapeError, match="expected mel of shape"):
        model.encode(tallow.zeros(1, 40, 20))
    with pytest.raises(ShapeError, match="more than the model's 60"):
        model.encode(tallow.zeros(1, 80, 61))
    model.encoder.cfg.activation = "gelu_new"  # the tanh GELU: the generic encoder runs it
    assert not CpuEncoder.supports(model)
    assert np.isfinite(model.encode(tallow.zeros(1, 80, 10)).numpy()).all()


def _threads_or_skip():
    from tallow.backends.cpu import attention
    if attention.blas_threads()[1] < 2:
        pytest.skip("BLAS runs one thread here (threadpoolctl missing or one core)")


def test_row_threads_give_the_one_thread_result(checkpoint):
    _threads_or_skip()
    from threadpoolctl import threadpool_limits
    path, torch, _ = checkpoint
    model = whisper.load(path, device="cpu")
    torch.manual_seed(5)
    mel = tallow.tensor(torch.randn(1, 80, 2 * POSITIONS - 1).tolist())
    threaded = model.encode(mel).numpy()
    with threadpool_limits(1, user_api="blas"):
        single = model.encode(mel).numpy()
    assert abs(threaded - single).max() <= 1e-6


def test_an_error_in_one_row_thread_surfaces_without_a_hang(checkpoint, monkeypatch):
    _threads_or_skip()
    from tallow.models import whisper_cpu_encoder
    path, _, _ = checkpoint
    model = whisper.load(path, device="cpu")
    real = whisper_cpu_encoder._Layer.project

    def failing(self, x, qkv, lo, hi, weights):
        if lo > 0:
            raise ValueError("row thread failed")
        real(self, x, qkv, lo, hi, weights)

    monkeypatch.setattr(whisper_cpu_encoder._Layer, "project", failing)
    with pytest.raises(ValueError, match="row thread failed"):
        model.encode(tallow.zeros(1, 80, 2 * POSITIONS))
