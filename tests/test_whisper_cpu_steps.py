"""Whisper on the CPU device through the generic modules and the CPU backend's kernels
(backends/cpu/float_steps.py, runtime/blas_rows.py): beams, cache reordering and multi-token
continuations against transformers; f16-exact weights multiplied by their f16 copies with
one-token steps captured and replayed as a step program; q8_0 weights captured against eager;
the encoder's row-split products against one thread. Small random checkpoints."""
import numpy as np
import pytest
from test_whisper import _random_checkpoint

import tallow
from tallow.models import whisper

POSITIONS = 30  # encoder positions of the random model (60 mel frames)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper_random")
    torch, ref = _random_checkpoint(path, 80, POSITIONS)
    torch.manual_seed(3)
    return path, torch, ref, torch.randn(1, 80, 2 * POSITIONS)


def _kernels_or_skip():
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        pytest.skip("TALLOW_CPU=numpy")


def _reference(torch, ref, feats, seqs):
    with torch.no_grad():
        return ref(input_features=feats.expand(len(seqs), -1, -1),
                   decoder_input_ids=torch.tensor(seqs)).logits.numpy()


def test_beams_reorders_and_continuations_match_transformers(checkpoint):
    path, torch, ref, feats = checkpoint
    model = whisper.load(path, device="cpu")
    state = model.start(model.encode(tallow.tensor(feats.tolist())))
    seqs = [[1, 5, 7]]
    prefill = model.decode_step(seqs, state, positions=None).numpy()
    assert abs(prefill - _reference(torch, ref, feats, seqs)).max() <= 1e-4
    state.reorder([0, 0, 0])  # one prompt row -> three beams
    seqs = seqs * 3
    for step, sources in enumerate(([2, 0, 1], [1, 1, 0], [0, 1, 2])):
        tokens = [10 + 3 * step + i for i in range(3)]
        got = model.decode_step([[t] for t in tokens], state).numpy()
        seqs = [s + [t] for s, t in zip(seqs, tokens)]
        want = _reference(torch, ref, feats, seqs)[:, -1:]
        assert got.shape == want.shape and abs(got - want).max() <= 1e-4, f"step {step}"
        state.reorder(sources)  # the same batch: rows rewritten in place
        seqs = [seqs[i] for i in sources]
    # two new tokens per row at once: causal within them, over the cached rows
    extra = [[40, 41], [42, 43], [44, 45]]
    got = model.decode_step(extra, state, positions=None).numpy()
    seqs = [s + e for s, e in zip(seqs, extra)]
    assert abs(got - _reference(torch, ref, feats, seqs)[:, -2:]).max() <= 1e-4
    assert state.length == len(seqs[0])


def test_f16_exact_weights_replay_a_step_program_and_match_transformers(tmp_path, monkeypatch):
    """A checkpoint whose matrices are f16 values (as Whisper's are): the decoder's few-row
    products read f16 copies (half the bytes), one-token steps are captured and replay as one
    step program, and the logits are transformers'."""
    _kernels_or_skip()
    from tallow.backends.cpu import f16_copies
    from tallow.backends.cpu.runtime import step_program
    torch, ref = _random_checkpoint(tmp_path, 80, POSITIONS)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.half().float())
    ref.save_pretrained(tmp_path, safe_serialization=True)
    built = []
    real_build = step_program.build
    monkeypatch.setattr(step_program, "build", lambda entries: built.append(real_build(entries)) or built[-1])
    model = whisper.load(tmp_path, device="cpu")
    feats = torch.randn(1, 80, 2 * POSITIONS)
    state = model.start(model.encode(tallow.tensor(feats.tolist())))
    seqs = [[1, 5, 7]]
    assert abs(model.decode_step(seqs, state, positions=None).numpy() - _reference(torch, ref, feats, seqs)).max() <= 1e-4
    head = model.decoder.embed_tokens.weight
    assert f16_copies.exact_f16(head._storage, 0, *head.shape) is not None
    for token in (11, 12, 13, 14):
        seqs = [seqs[0] + [token]]
        got = model.decode_step([[token]], state).numpy()
        assert abs(got - _reference(torch, ref, feats, seqs)[:, -1:]).max() <= 1e-4, token
    assert built and all(p is not None for p in built)  # the replays ran as a step program


def test_q8_0_captured_steps_give_the_eager_logits(checkpoint):
    _kernels_or_skip()
    path, _, _, feats = checkpoint
    model = whisper.load(path, device="cpu", quantize="q8_0")
    features = model.encode(tallow.tensor(feats.tolist()))
    captured, eager = model.start(features), model.start(features)
    for ids in ([[1, 5, 7]], [[9]], [[11]], [[13]], [[15]]):
        got = model.decode_step(ids, captured).numpy()
        model.capture_decode = False
        try:
            want = model.decode_step(ids, eager).numpy()
        finally:
            model.capture_decode = True
        assert abs(got - want).max() <= 1e-5
    assert captured.replays.graph is not None  # the one-token steps replayed


@pytest.mark.parametrize("frames", [2 * POSITIONS, 2 * POSITIONS - 7])
def test_encoder_matches_transformers_and_one_thread(checkpoint, frames):
    from tallow.backends.cpu.runtime import blas_rows
    path, torch, ref, _ = checkpoint
    model = whisper.load(path, device="cpu")
    torch.manual_seed(frames)
    feats = torch.randn(2, 80, frames)  # two audios in one batch
    mel = tallow.tensor(feats.tolist())
    got = model.encode(mel).numpy()
    assert got.shape == (2, (frames + 1) // 2, 64)
    if frames == 2 * POSITIONS:  # transformers accepts exactly 2 * max_source_positions frames
        with torch.no_grad():
            want = ref.model.encoder(feats).last_hidden_state.numpy()
        assert abs(got - want).max() <= 1e-4
    if blas_rows.blas_threads()[1] >= 2:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(1, user_api="blas"):  # no row split: one BLAS call per product
            single = model.encode(mel).numpy()
        assert abs(got - single).max() <= 1e-5


def test_row_split_products_match_numpy():
    from tallow.backends.cpu.runtime import blas_rows
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((blas_rows.MIN_ROWS + 37, 48), np.float32), rng.standard_normal((48, 20), np.float32)
    np.testing.assert_allclose(blas_rows.matmul(x, w), x @ w, rtol=1e-5, atol=1e-5)
    out = np.zeros((x.shape[0], 30), np.float32)
    blas_rows.matmul(x, w, out=out[:, 5:25])  # into a column block of a wider array
    np.testing.assert_allclose(out[:, 5:25], x @ w, rtol=1e-5, atol=1e-5)
    assert not out[:, :5].any() and not out[:, 25:].any()


def test_reused_arrays_hand_out_a_buffer_only_once_nothing_refers_to_it():
    from tallow.backends.cpu.runtime import reused_arrays
    reused_arrays.release()
    shape = (reused_arrays.MIN_BYTES // 4 // 64, 64)
    a = reused_arrays.empty(shape)
    a[:] = 1.0
    view = a.reshape(-1)[5:]  # a view keeps the memory taken after `a` goes
    address = a.__array_interface__["data"][0]
    del a
    b = reused_arrays.empty(shape)
    assert b.__array_interface__["data"][0] != address and (view == 1.0).all()
    del view
    c = reused_arrays.empty(shape)  # now free: the same memory again
    assert c.__array_interface__["data"][0] == address
    small = reused_arrays.empty((4, 4))
    assert small.shape == (4, 4) and small.dtype == np.float32
    del b, c
    reused_arrays.release()  # (as a decoding step starts) nothing refers to them: they go
    assert not reused_arrays._held
