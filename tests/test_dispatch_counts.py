"""Dispatches per transformer layer in one-token decode on the GPU path, counted with the
do-nothing driver (wgpu_backend/driver_null.py). Host time per token grows with this
count, so it is pinned here; bench/gpu_host.py measures the time itself."""
import pytest

import tallow
from tallow.device import restore_backend, use_backend

pytest.importorskip("transformers")
from tallow_wgpu.backend import WgpuBackend  # noqa: E402
from tallow_wgpu.driver_null import NullDriver  # noqa: E402
from tiny_llama import save_tiny_llama  # noqa: E402

# Issue #13 item 2 took this from 20 to 8: residual add + input norm, q/k/v as one matvec,
# rope fused with the KV-cache write, attention, o_proj, residual add + post-attention norm,
# gate/up as one matvec with SwiGLU fused in, down.
MAX_DISPATCHES_PER_LAYER = 8


def _decode_dispatches(tmp_path, layers):
    folder = tmp_path / f"llama{layers}"
    folder.mkdir()
    save_tiny_llama(folder, ["hello world, the quick brown fox"] * 8, num_hidden_layers=layers)
    driver = NullDriver()
    try:
        dev = use_backend("wgpu", WgpuBackend(driver))
        model = tallow.load_model(str(folder), device=dev)
        cache = model.new_cache()
        model([1, 2, 3], cache=cache, last_only=True).tolist()
        driver.reset_counts()
        model([4], cache=cache, last_only=True).tolist()
        return driver.dispatches, dict(driver.by_kernel)
    finally:
        restore_backend("wgpu")


def test_decode_dispatches_per_layer_are_bounded(tmp_path):
    two, _ = _decode_dispatches(tmp_path, 2)
    four, kernels = _decode_dispatches(tmp_path, 4)
    per_layer = (four - two) / 2
    assert per_layer == int(per_layer), "every layer issues the same dispatches"
    assert per_layer <= MAX_DISPATCHES_PER_LAYER, (per_layer, kernels)
    assert two - 2 * per_layer <= 4, "outside the layers: embedding, final norm, head"
