"""Whisper's numpy decoder path (tallow.models.whisper_cpu_decoder) against transformers
(beams, cache reordering, multi-token continuations) and against the generic decoder
(q8_0 weights), plus its errors. Small random checkpoints: a few seconds in all."""
import os
import subprocess
import sys

import numpy as np
import pytest
from test_whisper import _random_checkpoint

import tallow
from tallow.errors import IndexRangeError, ShapeError
from tallow.models import whisper
from tallow.models.whisper import DecoderState
from tallow.models.whisper_cpu_decoder import CpuDecoderState

POSITIONS = 30  # encoder positions of the random model (60 mel frames)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper_random")
    torch, ref = _random_checkpoint(path, 80, POSITIONS)
    torch.manual_seed(3)
    return path, torch, ref, torch.randn(1, 80, 2 * POSITIONS)


def _reference(torch, ref, feats, seqs):
    with torch.no_grad():
        return ref(input_features=feats.expand(len(seqs), -1, -1),
                   decoder_input_ids=torch.tensor(seqs)).logits.numpy()


def test_beams_reorders_and_continuations_match_transformers(checkpoint):
    path, torch, ref, feats = checkpoint
    model = whisper.load(path, device="cpu")
    state = model.start(model.encode(tallow.tensor(feats.tolist())))
    assert isinstance(state, CpuDecoderState)
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


def test_f16_exact_weights_take_the_f16_kernel_and_match_transformers(tmp_path):
    """A checkpoint whose matrices are f16 values (as Whisper's are): with the CPU kernels the
    decoder multiplies f16 copies (half the bytes), with the same logits as transformers."""
    pytest.importorskip("numba")
    from tallow.backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        pytest.skip("TALLOW_CPU=numpy")
    torch, ref = _random_checkpoint(tmp_path, 80, POSITIONS)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.half().float())
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = whisper.load(tmp_path, device="cpu")
    feats = torch.randn(1, 80, 2 * POSITIONS)
    state = model.start(model.encode(tallow.tensor(feats.tolist())))
    decoder = model._cpu_decoder
    assert decoder.head.f16 is not None and all(layer.fc1.f16 is not None for layer in decoder.layers)
    seqs = [[1, 5, 7]]
    assert abs(model.decode_step(seqs, state, positions=None).numpy() - _reference(torch, ref, feats, seqs)).max() <= 1e-4
    state.reorder([0, 0])
    seqs = [s + [t] for s, t in zip(seqs * 2, (11, 12))]
    got = model.decode_step([[11], [12]], state).numpy()
    assert state.program is not None  # one-token steps ran as one step program (whisper_cpu_step.py)
    assert abs(got - _reference(torch, ref, feats, seqs)[:, -1:]).max() <= 1e-4
    state.reorder([1, 0])  # the same batch: the caches rewritten in place, the program kept
    program = state.program
    seqs = [seqs[1] + [13], seqs[0] + [14]]
    got = model.decode_step([[13], [14]], state).numpy()
    assert state.program is program and abs(got - _reference(torch, ref, feats, seqs)[:, -1:]).max() <= 1e-4


def test_generic_decoder_when_turned_off(checkpoint):
    path, _, _, feats = checkpoint
    model = whisper.load(path, device="cpu")
    features = model.encode(tallow.tensor(feats.tolist()))
    fast = model.decode_step([[1, 5, 7]], model.start(features)).numpy()
    model.cpu_direct = False
    state = model.start(features)
    assert isinstance(state, DecoderState)
    assert abs(model.decode_step([[1, 5, 7]], state).numpy() - fast).max() <= 1e-5


def test_q8_0_weights_match_the_generic_decoder(checkpoint):
    pytest.importorskip("numba")  # the integer-dot kernels this path runs q8_0 with
    path, _, _, feats = checkpoint
    model = whisper.load(path, device="cpu", quantize="q8_0")
    features = model.encode(tallow.tensor(feats.tolist()))
    fast_state = model.start(features)
    assert isinstance(fast_state, CpuDecoderState)
    model.cpu_direct = False
    slow_state = model.start(features)
    for ids in ([[1, 5, 7]], [[9]], [[11]]):
        slow = model.decode_step(ids, slow_state).numpy()
        model.cpu_direct = True  # the switch is read at start(): the states keep their paths
        fast = model.decode_step(ids, fast_state).numpy()
        model.cpu_direct = False
        assert abs(fast - slow).max() <= 1e-4
    assert fast_state.program is not None  # the one-token steps on blocks ran as a step program


def test_bad_ids_and_lengths_are_clear_errors(checkpoint):
    path, _, _, feats = checkpoint
    model = whisper.load(path, device="cpu")
    state = model.start(model.encode(tallow.tensor(feats.tolist())))
    with pytest.raises(IndexRangeError, match="token id 1000 is out of range"):
        model.decode_step([[1000]], state)
    with pytest.raises(IndexRangeError, match="token id -1"):
        model.decode_step([[-1]], state)
    with pytest.raises(ShapeError, match="rows of equal length"):
        model.decode_step([[1, 2], [3]], state)
    with pytest.raises(ShapeError, match="more than the model's 64 positions"):
        model.decode_step([list(range(65))], state)
    assert state.length == 0  # nothing was written by the refused steps
    model.decode_step([[1, 2]], state)
    with pytest.raises(ShapeError, match="reorder the state first"):
        model.decode_step([[3], [4]], state)
    with pytest.raises(IndexRangeError, match="reorder row 2 is not one of the 1 rows"):
        state.reorder([0, 2])
    with pytest.raises(ShapeError, match="audio features"):
        model.start(tallow.zeros(1, POSITIONS, 8))
    two_audios = model.start(model.encode(tallow.tensor(feats.tolist() * 2)))
    with pytest.raises(ShapeError, match="3 rows over audio features of batch 2"):
        model.decode_step([[1], [1], [1]], two_audios)
    assert np.isfinite(model.decode_step([[3]], state).numpy()).all()


def test_other_devices_never_import_the_numpy_paths(checkpoint):
    """The browser runs Whisper on the pure-Python backend without numpy installed: the direct
    numpy modules must not even be imported there (a fresh interpreter with numpy hidden)."""
    path, torch, ref, feats = checkpoint
    code = ("import sys; sys.modules['numpy'] = None\n"
            "import tallow\nfrom tallow.models import whisper\n"
            f"model = whisper.load({str(path)!r}, device='python')\n"
            f"state = model.start(model.encode(tallow.tensor({feats.tolist()!r})))\n"
            "logits = model.decode_step([[1, 5]], state)\n"
            "assert logits.shape[-1] == model.config.vocab_size, logits.shape\n"
            "print(sorted(m for m in sys.modules if 'whisper_cpu' in m))\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(tallow.__file__))}  # this tree's tallow
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
