"""Whisper tiny.en on the wasm device, natively under wasmtime: load_model(..., device="wasm") and
tallow's normal transcribe path give the CPU device's transcript of jfk.wav, the encoder on the
wasm GEMM, conv1d and composed attention, and the decoder's steps captured and replayed (each one
`run` call of kernels.wasm)."""
import pytest

import tallow

pytest.importorskip("wasmtime", reason="the wasm device runs natively under wasmtime: pip install wasmtime")
from tallow.backends.wasm import build  # noqa: E402

pytestmark = pytest.mark.models

if not __import__("os").path.exists(build.SHIPPED):
    pytest.skip("kernels.wasm is not built here: make wasm", allow_module_level=True)


def test_jfk_on_the_wasm_device_is_the_cpu_devices_transcript_with_replayed_decoder_steps(whisper_tiny_dir, jfk_wav):
    cpu = tallow.load_model(str(whisper_tiny_dir), device="cpu").transcribe(str(jfk_wav))
    model = tallow.load_model(str(whisper_tiny_dir), device="wasm")
    assert model.device.type == "wasm"
    backend = model.device.backend
    before = backend.replays
    got = model.transcribe(str(jfk_wav))
    assert got.text == cpu.text
    assert "ask not what your country can do for you" in got.text
    assert [(s.start, s.end) for s in got.segments] == [(s.start, s.end) for s in cpu.segments]
    assert backend.replays - before >= 10  # the decoder's steps after the first two replay
