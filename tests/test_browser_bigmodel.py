"""Phi-sized models in the page (headless Chromium, WebGPU on SwiftShader): weights files read in
slices (never one ArrayBuffer), tensors bound in pieces, first-token logits equal native tallow's.

In CI the mechanics run on tiny synthetic files of the real Phi-2 / Phi-3 architectures
(scripts/make_synthetic_gguf.py) with the slice size lowered to 64 KiB and the GPU binding limit
to 384 KiB (the page's ?slice_mb= and ?max_binding_mb=), so a 3 MB file is read in ~50 slices and
its embedding, output head and feed-forward weights are split across bindings. Phi-2 comes through
the Cache API (downloaded as a stream into the cache, then read back as a Blob), Phi-3 through the
page's file input. TALLOW_BIG_PHI=1 also writes the full-size synthetic Phi-2 / Phi-3-mini Q4_0 files
(1.6 / 2.2 GB) and loads them through the file input (slow on an emulated GPU: minutes).
"""
import importlib.util
import json
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
ARTIFACTS = os.path.join(REPO_ROOT, "test-artifacts", "browser")
SLICE = 64 * 1024
BINDING = 384 * 1024
# ?device=wgpu: the page's automatic choice passes over a software adapter (SwiftShader) for the
# wasm device; these tests are about WebGPU's bindings, so they ask for it.
QUERY = f"?device=wgpu&slice_mb={SLICE / 2**20}&max_binding_mb={BINDING / 2**20}"
PROMPT_IDS = [5, 17, 300, 2, 41]
# f32 on SwiftShader vs numpy: same math, different summation order. Both models' logits are O(5).
TOLERANCE = 1e-4  # times the largest |logit|

pytestmark = pytest.mark.browser


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load("tallow_tests_browser_harness", os.path.join(HERE, "browser", "harness.py"))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
import make_synthetic_gguf as maker  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A built demo whose manifest also offers a tiny synthetic Phi-2; and a tiny Phi-3 file to pick."""
    harness.require_browser()
    root = tmp_path_factory.mktemp("bigmodel")
    dist = str(root / "dist")
    harness.build_test_site(dist, models=False)
    folder = os.path.join(dist, "models", "synthetic-phi2")
    os.makedirs(folder, exist_ok=True)
    phi2 = os.path.join(folder, "phi2-tiny.Q4_0.gguf")
    maker.write(phi2, "phi2", "q4_0", scale=1 / 8, layers=2, seed=11)
    size = os.path.getsize(phi2)
    with open(os.path.join(dist, "models", "manifest.json")) as f:
        manifest = json.load(f)
    manifest["models"]["synthetic-phi2"] = {
        "kind": "llm", "title": "Phi-2 (synthetic, tiny) Q4_0", "missing": None, "bytes": size,
        "files": [{"name": "phi2-tiny.Q4_0.gguf", "url": "models/synthetic-phi2/phi2-tiny.Q4_0.gguf?v=1", "size": size}]}
    with open(os.path.join(dist, "models", "manifest.json"), "w") as f:
        json.dump(manifest, f)
    phi3 = str(root / "phi3-tiny.Q8_0.gguf")
    maker.write(phi3, "phi3", "q8_0", scale=1 / 8, layers=2, seed=12)
    return {"dist": dist, "phi2": phi2, "phi3": phi3}


@pytest.fixture(scope="module")
def demo(site):
    with harness.DemoBrowser(site["dist"], artifacts=ARTIFACTS) as d:
        yield d


def _native(path, ids=PROMPT_IDS):
    """tallow on numpy, natively, on the same file: the last position's logits (the first token's)."""
    from tallow.models.loader import load_gguf
    model = load_gguf(path, device="cpu")
    return model(ids)[0, -1].numpy()


def _tensor_bytes(path):
    import tallow
    with tallow.io.open(path, format="gguf") as f:
        return sum(f.info(n).nbytes for n in f.keys())


def _header_bytes(path):
    import tallow
    with tallow.io.open(path, format="gguf") as f:
        return f.data_start


def _small_header_prefix(demo, page):
    """Python reads a GGUF header from a 4 MiB prefix (re-read longer if needed), which would be
    the whole of these tiny files: a 64 KiB first read shows that only the header enters Python."""
    demo.run(page, "import tallow.io.gguf as g\ng.FIRST_PREFIX = 65536\nNone")


def _page_logits(demo, page, key, ids=PROMPT_IDS, timeout_s=300):
    """The page's first-token logits for `key`, and how many weight lookups were split into pieces."""
    code = f"""
import tallow, tallow_wgpu.split as split
from tallow_web_worker import state
pieces, row_pieces = [], split.row_pieces
split.row_pieces = lambda *a: pieces.append(row_pieces(*a)) or pieces[-1]
try:
    model = state["models"][{key!r}]
    model.reset()
    logits = model({ids!r})[0, -1].tolist()
finally:
    split.row_pieces = row_pieces
{{"logits": logits, "split": sum(len(p) > 1 for p in pieces),
  "limit": tallow.Device("wgpu").backend.limits["max_storage_binding"]}}
"""
    return demo.run(page, code, timeout_s=timeout_s)


def _check_logits(got, want):
    np = pytest.importorskip("numpy")
    got = np.array(got["logits"], np.float32)
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    print(f"first-token logits: max |page - reference| = {err:.2e} (largest |logit| {scale:.2f})")
    assert got.shape == want.shape and scale > 0.2
    assert err <= TOLERANCE * scale, (err, scale)
    assert int(got.argmax()) == int(want.argmax())


def _check_sliced_load(info, path, file_bytes):
    assert info["device"] == "wgpu", info
    assert info["weights_bytes"] == file_bytes
    assert info["slice_bytes"] == SLICE and info["largest_slice"] <= SLICE  # never one big ArrayBuffer
    assert info["slices"] >= _tensor_bytes(path) // SLICE  # every tensor went through slices
    assert info["gpu_from_js"] == _tensor_bytes(path)  # every tensor JS -> GPU, Phi-2's q/k/v split included
    assert info["gpu_from_python"] < 64 * 1024
    header = _header_bytes(path)
    assert header <= info["read_into_python"] <= 4 * header  # the header (metadata, vocabulary) only


def test_tiny_phi2_from_the_cache_api_in_slices_with_split_bindings(demo, site):
    page = demo.open(QUERY)
    try:
        ready = page.evaluate("window.tallowDemo.ready")
        assert ready["device"] == "wgpu", f"WebGPU did not come up in Chromium: {ready['gpu_error']}"
        assert ready["gpu"]["max_storage_binding"] == BINDING
        _small_header_prefix(demo, page)
        first = demo.request(page, "load", model="synthetic-phi2", timeout_s=300)
        size = os.path.getsize(site["phi2"])
        _check_sliced_load(first, site["phi2"], size)
        assert first["from_cache"] == 0
        got = _page_logits(demo, page, "synthetic-phi2")
        assert got["limit"] == BINDING and got["split"] > 0
        _check_logits(got, _native(site["phi2"]))
        options = page.eval_on_selector_all("#chat-model option", "os => os.map(o => o.textContent)")
        assert any("Phi-2 (synthetic, tiny) Q4_0" in o and f"{size / 1e6:.1f} MB" in o for o in options), options
        demo.goto(page, QUERY)  # a reload: the file now comes from the Cache API, still in slices
        _small_header_prefix(demo, page)
        again = demo.request(page, "load", model="synthetic-phi2", timeout_s=300)
        assert again["from_cache"] == size
        _check_sliced_load(again, site["phi2"], size)
        demo.screenshot(page, "bigmodel_phi2_cache")
    finally:
        page.close()
    assert not demo.errors(), demo.errors()


def test_tiny_phi3_picked_from_disk_in_slices_with_split_bindings(demo, site):
    page = demo.open(QUERY)
    try:
        _small_header_prefix(demo, page)
        page.set_input_files("#open-model", site["phi3"])
        page.wait_for_function("[...window.tallowDemo.loaded.keys()].some((k) => k.startsWith('local-')) || "
                               "!document.getElementById('error').hidden", timeout=300_000)
        assert page.is_hidden("#error"), page.inner_text("#error")
        key, info = page.evaluate("[...window.tallowDemo.loaded.entries()].find(([k]) => k.startsWith('local-'))")
        _check_sliced_load(info, site["phi3"], os.path.getsize(site["phi3"]))
        options = page.eval_on_selector_all("#chat-model option", "os => os.map(o => o.textContent)")
        assert any("phi3-tiny.Q8_0.gguf (from disk)" in o and "MB" in o for o in options), options
        assert page.eval_on_selector("#chat-model", "s => s.value") == key
        got = _page_logits(demo, page, key)
        assert got["split"] > 0
        _check_logits(got, _native(site["phi3"]))
        demo.screenshot(page, "bigmodel_phi3_picked")
    finally:
        page.close()
    assert not demo.errors(), demo.errors()


def test_a_sharded_hugging_face_folder_picked_from_disk_matches_transformers(demo, tmp_path):
    """A Hugging Face folder (config.json + model-0000N-of-0000M.safetensors + index) picked with the
    folder input: its small files go to Python's file system, its shards are read in slices and their
    tensors go JS -> GPU; the first-token logits equal transformers' on the same folder."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.Phi3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1)
    model = tf.Phi3ForCausalLM(config).eval()
    folder = tmp_path / "tiny-phi3-hf"
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="150KB")
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").exists()
    with torch.no_grad():
        want = model(torch.tensor([PROMPT_IDS])).logits[0, -1].numpy()
    page = demo.open(QUERY)
    try:
        page.set_input_files("#open-folder", str(folder))
        page.wait_for_function("[...window.tallowDemo.loaded.keys()].some((k) => k.startsWith('local-')) || "
                               "!document.getElementById('error').hidden", timeout=300_000)
        assert page.is_hidden("#error"), page.inner_text("#error")
        key, info = page.evaluate("[...window.tallowDemo.loaded.entries()].find(([k]) => k.startsWith('local-'))")
        weights = sum((folder / name).stat().st_size for name in shards)
        assert info["device"] == "wgpu" and info["weights_bytes"] == weights
        assert info["largest_slice"] <= SLICE and info["slices"] > weights // SLICE
        assert info["gpu_from_js"] > 0.95 * weights and info["read_into_python"] < 0.05 * weights
        options = page.eval_on_selector_all("#chat-model option", "os => os.map(o => o.textContent)")
        assert any("tiny-phi3-hf (from disk)" in o for o in options), options
        _check_logits(_page_logits(demo, page, key), want)
    finally:
        page.close()
    assert not demo.errors(), demo.errors()


@pytest.mark.skipif(os.environ.get("TALLOW_BIG_PHI") != "1", reason="full-size Phi files: set TALLOW_BIG_PHI=1 "
                    "(writes 1.6 + 2.2 GB to a temporary folder; minutes on an emulated GPU)")
@pytest.mark.parametrize("arch", ["phi2", "phi3"])
def test_full_size_synthetic_phi_in_the_page(demo, arch, tmp_path):
    path = str(tmp_path / f"{arch}-synthetic.Q4_0.gguf")
    started = time.perf_counter()
    size = maker.write(path, arch, "q4_0", seed=21)
    written = time.perf_counter() - started
    page = demo.open("?device=wgpu")  # the real settings: 64 MiB slices, the adapter's own binding limit
    try:
        started = time.perf_counter()
        page.set_input_files("#open-model", path)
        page.wait_for_function("[...window.tallowDemo.loaded.keys()].some((k) => k.startsWith('local-')) || "
                               "!document.getElementById('error').hidden", timeout=1_200_000)
        assert page.is_hidden("#error"), page.inner_text("#error")
        key, info = page.evaluate("[...window.tallowDemo.loaded.entries()].find(([k]) => k.startsWith('local-'))")
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        got = _page_logits(demo, page, key, timeout_s=1200)
        first_token = time.perf_counter() - started
        print(f"{arch}: {size / 1e9:.2f} GB written in {written:.0f} s; page load {info['load_s']:.1f} s "
              f"(test saw {loaded:.1f} s), wasm heap {info['heap_bytes'] / 2**20:.0f} MiB, "
              f"GPU from JS {info['gpu_from_js'] / 1e9:.2f} GB in {info['slices']} slices, "
              f"read into Python {info['read_into_python'] / 1e6:.1f} MB; first-token logits in {first_token:.1f} s")
        assert info["largest_slice"] <= 64 << 20 and info["gpu_from_js"] == _tensor_bytes(path)
        _check_logits(got, _native(path))
    finally:
        page.close()
