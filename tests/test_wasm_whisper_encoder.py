"""kernels.wasm has everything Whisper's encoder needs: whisper-tiny.en's encoder written out as one
program of kernel calls (tests/wasm_whisper_encoder.py: the convolutions as im2col + GEMM, the f16
weights' GEMMs, attention by GEMMs and softmax rows, LayerNorm rows, strided copies) and run by
one `run` call under wasmtime equals transformers' float32 encoder on jfk.wav's log-mel.

Like tests/test_wasm_smollm2.py, a proof of the kernels, not the wasm device (which records the
same calls from the model's own ops)."""
import os

import numpy as np
import pytest

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402
from wasm_whisper_encoder import WasmWhisperEncoder  # noqa: E402

pytestmark = pytest.mark.models

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)

JFK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "jfk.wav")


def test_whisper_tiny_encoder_as_one_wasm_program_equals_transformers(whisper_tiny_dir):
    from tallow.audio.load import load_audio
    from tallow.audio.mel import log_mel_spectrogram
    samples = np.asarray(load_audio(JFK), np.float32)
    mel = np.asarray(log_mel_spectrogram(samples, padding=480000), np.float32)[:, :3000]  # 30 s, as Whisper pads
    encoder = WasmWhisperEncoder(str(whisper_tiny_dir), Kernels(build.build()))
    calls = encoder.program[1]
    got = encoder(mel)
    ref = transformers.WhisperModel.from_pretrained(str(whisper_tiny_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref.encoder(torch.from_numpy(mel)[None]).last_hidden_state[0].numpy()
    assert got.shape == want.shape == (1500, 384)
    assert calls > 100  # the whole encoder: 4 layers of 6 heads
    # float32 sums in another order, through 4 layers: within 1e-4 of the output's largest value
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), np.abs(got - want).max()
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99999
