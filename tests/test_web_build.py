"""web/build.py's static site without a browser: model files copied (never linked), split into
parts under the size limit that join back to the original bytes, the test-only hook left out of
a normal build, and web/src/worker.py's progress and no-speech answers run natively."""
import importlib.util
import json
import os
import subprocess
import sys
import types
from array import array
from pathlib import Path

import pytest

import tallow

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load("tallow_web_build_test", REPO_ROOT / "web" / "build.py")


@pytest.fixture
def home(tmp_path):
    """A tallow cache with the demo's files, of sizes that split unevenly into 700-byte parts."""
    root = tmp_path / "home"
    for n, (name, spec) in enumerate(build.MODELS.items()):
        (root / name).mkdir(parents=True)
        for i, f in enumerate(spec["files"]):
            size = 2500 + 333 * n if f.endswith((".gguf", ".safetensors")) else 100 + i
            (root / name / f).write_bytes(bytes((j * 7 + i + n) % 251 for j in range(size)))
    return root


def _joined(dist, entry, item):
    pieces = item.get("parts") or [{"url": item["url"], "size": item["size"]}]
    data = b""
    for p in pieces:
        path = dist / p["url"].split("?")[0]
        assert path.stat().st_size == p["size"]
        data += path.read_bytes()
    return data


def test_models_are_copied_and_big_files_split_into_parts_that_join_to_the_original(home, tmp_path):
    dist = tmp_path / "dist"
    manifest = build.copy_models(str(dist), str(home), quiet=True, part_bytes=700)
    build.check_static(str(dist))
    for name, entry in manifest["models"].items():
        assert entry["missing"] is None
        for item in entry["files"]:
            original = (home / name / item["name"]).read_bytes()
            assert item["size"] == len(original)
            assert _joined(dist, entry, item) == original
            if len(original) > 700:  # split: parts of 700 bytes and a shorter last one, no whole copy
                sizes = [p["size"] for p in item["parts"]]
                assert sizes[:-1] == [700] * (len(sizes) - 1) and 0 < sizes[-1] <= 700
                assert not (dist / "models" / name / item["name"]).exists()
            else:
                assert "parts" not in item
    for root, dirs, files in os.walk(dist):
        for f in dirs + files:
            path = Path(root) / f
            assert not path.is_symlink(), path
            assert path.is_dir() or path.name == "manifest.json" or path.stat().st_size <= 700


def test_a_rebuild_replaces_an_old_builds_symlinks_and_parts_of_another_size(home, tmp_path):
    dist = tmp_path / "dist"
    gguf = build.MODELS["smollm2-135m-instruct"]["files"][0]
    folder = dist / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    os.symlink(home / "smollm2-135m-instruct" / gguf, folder / gguf)  # what the old build wrote
    build.copy_models(str(dist), str(home), quiet=True, part_bytes=10_000)
    assert not (folder / gguf).is_symlink() and (folder / gguf).read_bytes() == (home / "smollm2-135m-instruct" / gguf).read_bytes()
    manifest = build.copy_models(str(dist), str(home), quiet=True, part_bytes=1000)
    assert sorted(os.listdir(folder)) == [f"{gguf}.part000", f"{gguf}.part001", f"{gguf}.part002"]
    item = manifest["models"]["smollm2-135m-instruct"]["files"][0]
    assert _joined(dist, None, item) == (home / "smollm2-135m-instruct" / gguf).read_bytes()
    # the part size is in the version tag: a browser never joins parts of two layouts
    assert all(p["url"].endswith(item["url"].split("?")[1]) for p in item["parts"])


def test_a_missing_model_is_listed_with_the_command_that_fetches_it(home, tmp_path):
    (home / "whisper-tiny.en" / "model.safetensors").unlink()
    manifest = build.copy_models(str(tmp_path / "dist"), str(home), quiet=True, part_bytes=700)
    entry = manifest["models"]["whisper-tiny.en"]
    assert entry["files"] == [] and "tallow fetch whisper-tiny.en" in entry["missing"]


def test_check_static_refuses_a_symlink_and_a_file_over_the_limit(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.html").write_text("ok")
    build.check_static(str(dist))
    os.symlink(dist / "index.html", dist / "link.html")
    with pytest.raises(build.BuildError, match="link.html is a symlink"):
        build.check_static(str(dist))
    (dist / "link.html").unlink()
    with open(dist / "big.bin", "wb") as f:  # sparse: no 100 MB written
        f.truncate(build.MAX_FILE_BYTES + 1)
    with pytest.raises(build.BuildError, match="big.bin is 100 MB"):
        build.check_static(str(dist))


def test_the_shipped_site_has_no_run_hook_and_the_test_build_has_it(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    build.copy_site(str(dist), test_hooks=True)
    assert (dist / build.TEST_HOOKS).exists()
    build.copy_site(str(dist), test_hooks=False)
    assert not (dist / build.TEST_HOOKS).exists()
    assert "run_code" not in (dist / "worker.py").read_text()
    assert (dist / ".nojekyll").exists()  # GitHub Pages serves the folder as it is
    assert (dist / "examples" / "jfk.wav").read_bytes() == (REPO_ROOT / "tests" / "data" / "jfk.wav").read_bytes()


@pytest.mark.parametrize("value, says", [("0", "more than 0"), ("101", "at most 100"), ("x", "a number of MB")])
def test_a_bad_part_size_in_the_environment_is_refused(monkeypatch, value, says):
    monkeypatch.setenv("TALLOW_WEB_PART_MB", value)
    with pytest.raises(build.BuildError, match=says):
        build.part_bytes_from_env()


def test_the_part_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("TALLOW_WEB_PART_MB", "0.5")
    assert build.part_bytes_from_env() == 500_000
    monkeypatch.delenv("TALLOW_WEB_PART_MB")
    assert build.part_bytes_from_env() == build.DEFAULT_PART_MB * build.MB < build.MAX_FILE_BYTES


@pytest.mark.parametrize("value, says", [("0", "0 must be more than 0"), ("150", "at most 100"),
                                         ("many", "not a number")])
def test_tallow_web_build_refuses_a_bad_part_size_in_one_line(value, says, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(tallow.__file__)),
                                                                    os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "tallow", "web", "build", "--out", str(tmp_path / "o"),
                           "--part-mb", value],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()


# ---- web/src/worker.py, natively (numpy): the messages the page shows ------------------------
class _JsBytes:
    """What a Float32Array looks like to Python in Pyodide: .to_bytes()."""

    def __init__(self, data):
        self.data = data

    def to_bytes(self):
        return self.data


@pytest.fixture(scope="module")
def worker():
    module = _load("tallow_web_worker_test", REPO_ROOT / "web" / "src" / "worker.py")
    module.state["device"] = tallow.Device("cpu")
    return module


def _whisper(worker):
    if "whisper" in worker.state["models"]:
        return
    try:
        worker.load_model("whisper", "whisper-tiny.en", "cpu")
    except tallow.errors.Error as e:
        pytest.skip(f"whisper-tiny.en is not in the tallow cache: {e}")


def test_transcribing_silence_says_no_speech(worker):
    """tiny.en "hears" " you" in silence but rates it as no speech (as openai-whisper keeps it):
    the worker answers no_speech, with the guess and its probability kept in the segments."""
    pytest.importorskip("numpy")
    _whisper(worker)
    segments, windows = [], []
    silence = array("f", [0.0] * 16000 * 2)  # 2 s: one window
    out = json.loads(worker.transcribe("whisper", _JsBytes(silence.tobytes()), True, segments.append,
                                       on_progress=lambda j: windows.append(json.loads(j))))
    assert out["no_speech"] is True and out["duration"] == 2.0
    assert all(s["no_speech_prob"] > worker.NO_SPEECH_THRESHOLD for s in out["segments"])
    done = [w for w in windows if w["stage"] == "window"]
    assert len(done) == 1 and done[0]["done_s"] == 2.0 and done[0]["left_s"] == 0


def test_progress_inside_a_window_names_the_stage_and_counts_the_tokens(worker):
    """The page shows progress inside a 30 s window (a minute or more on a slow device): the audio's
    duration first (the page's estimate), then the encoder, then every decoded token."""
    pytest.importorskip("numpy")
    _whisper(worker)
    wav = (REPO_ROOT / "tests" / "data" / "jfk.wav").read_bytes()
    segments, progress = [], []
    out = json.loads(worker.transcribe("whisper", _JsBytes(wav), False, segments.append, timestamps=False,
                                       on_progress=lambda j: progress.append(json.loads(j))))
    assert out["text"] == ("And so my fellow Americans ask not what your country can do for you, "
                           "ask what you can do for your country.")
    stages = [p["stage"] for p in progress]
    assert stages[:2] == ["audio", "encoding"] and stages[-1] == "window", stages
    assert progress[0]["duration"] == 11.0 and progress[0]["done_s"] == 0 and progress[0]["left_s"] is None
    decoding = [p for p in progress if p["stage"] == "decoding"]
    # one message per decoder call: the prompt's, then one per token up to <|endoftext|>
    assert [p["tokens"] for p in decoding] == list(range(1, len(decoding) + 1))
    tokens = worker.state["models"]["whisper"].tokenizer.encode(" " + out["text"], add_special_tokens=False)
    assert len(decoding) >= len(tokens)
    assert all(p["done_s"] == 0 for p in decoding) and progress[-1]["done_s"] == 11.0
    assert not {"encode", "start", "decode_step"} & set(vars(worker.state["models"]["whisper"]))  # unwrapped


def test_window_progress_estimates_the_time_left_from_the_time_per_second_so_far(worker, monkeypatch):
    from tallow.models import whisper_transcribe
    worker.state["models"]["stub"] = types.SimpleNamespace(encode=None, start=None, decode_step=None)
    clock = iter([100.0, 100.0, 106.0, 107.0, 108.0])  # start, audio read, after window 1 (6 s), after window 2, the end
    monkeypatch.setattr(worker.time, "perf_counter", lambda: next(clock))

    def fake_transcribe(model, samples, on_window, **kw):
        on_window(30.0)
        on_window(35.0)
        return whisper_transcribe.TranscriptionResult("", [], "en", 35.0)

    monkeypatch.setattr(whisper_transcribe, "transcribe", fake_transcribe)
    windows = []
    out = json.loads(worker.transcribe("stub", _JsBytes(array("f", [0.0] * 16000 * 35).tobytes()), True, print,
                                       on_progress=lambda j: windows.append(json.loads(j))))
    assert windows == [{"stage": "audio", "done_s": 0.0, "duration": 35.0, "elapsed_s": 0.0, "left_s": None, "tokens": 0},
                       {"stage": "window", "done_s": 30.0, "duration": 35.0, "elapsed_s": 6.0, "left_s": 1.0, "tokens": 0},
                       {"stage": "window", "done_s": 35.0, "duration": 35.0, "elapsed_s": 7.0, "left_s": 0.0, "tokens": 0}]
    assert out["no_speech"] is True and out["seconds"] == 8.0


def test_empty_audio_is_refused_with_a_readable_error(worker):
    _whisper(worker)
    with pytest.raises(tallow.errors.Error, match="the audio is empty"):
        worker.transcribe("whisper", _JsBytes(b""), True, print)


def test_cpu_speed_measures_a_positive_rate(worker):
    out = json.loads(worker.cpu_speed(0.05))
    assert out["flops_per_s"] > 0 and out["device"] == "cpu"


# ---- the page's device choice (worker.py's boot), natively: WebGPU is never there, so each
# request for it must fall back and say why, never fail the boot ----
def _fresh_worker():
    return _load("tallow_web_worker_boot_test", REPO_ROOT / "web" / "src" / "worker.py")


def _boot(requested, want_gpu=True):
    import asyncio
    module = _fresh_worker()
    return module, json.loads(asyncio.run(module.boot(want_gpu, None, requested)))


def test_device_python_overrides_the_automatic_choice_and_measures_that_device():
    module, info = _boot("python")
    assert info["device"] == "python" and info["device_note"] is None and "gpu" not in info
    assert info["gpu_error"] is None  # WebGPU was not even asked for
    assert info["measure_speed"] is True
    speed = json.loads(module.cpu_speed(0.02))
    assert speed["device"] == "python" and speed["flops_per_s"] > 0


def test_device_cpu_runs_on_numpy():
    pytest.importorskip("numpy")
    module, info = _boot("cpu")
    assert info["device"] == "cpu" and info["device_note"] is None
    assert json.loads(module.cpu_speed(0.02))["device"] == "cpu"


def test_device_wgpu_without_webgpu_falls_back_and_says_why():
    _, info = _boot("wgpu")
    assert info["device"] in ("cpu", "python")
    assert info["device_note"].startswith("?device=wgpu: WebGPU is not usable here (") and info["gpu_error"], info


# natively the page's wasm device cannot start (its driver is BrowserWasmDriver, Pyodide's): the boot says so
@pytest.mark.parametrize("requested, says", [("wasm", "?device=wasm: the WebAssembly device cannot run here "
                                                      "(DeviceError: the browser wasm driver runs only inside Pyodide"),
                                             ("tpu", "?device=tpu is not a device of this page (auto, wgpu, wasm")])
def test_a_device_the_page_cannot_run_is_named_and_the_choice_is_automatic(requested, says):
    _, info = _boot(requested)
    assert says in info["device_note"] and info["device"] in ("cpu", "python") and info["requested"] == requested


def test_device_wgpu_with_cpu_keeps_the_cpu():
    _, info = _boot("wgpu", want_gpu=False)
    assert "?cpu wins" in info["device_note"] and info["device"] in ("cpu", "python") and info["gpu_error"] is None


@pytest.mark.parametrize("gpu_info, emulated, software", [
    ({"adapter": "SwiftShader Device (Subzero)", "vendor": "google"}, False, True),
    ({"adapter": "", "vendor": "mesa", "architecture": "llvmpipe"}, False, True),
    ({"adapter": "lavapipe (LLVM 15.0.6, 256 bits)", "vendor": "mesa"}, False, True),
    ({"adapter": "Microsoft Basic Render Driver", "vendor": "microsoft"}, False, True),  # Windows' WARP
    ({"adapter": "unknown", "vendor": ""}, True, True),  # the adapter says isFallbackAdapter
    ({"adapter": "NVIDIA GeForce RTX 3060", "vendor": "nvidia", "architecture": "ampere"}, False, False),
    ({"adapter": "", "vendor": "intel", "architecture": "gen-12lp"}, False, False),
])
def test_software_adapters_are_told_from_gpus(gpu_info, emulated, software):
    assert _fresh_worker().software_adapter(gpu_info, emulated) is software


@pytest.mark.parametrize("requested, wasm_runs, chosen", [("auto", True, "wasm"), ("auto", False, "wgpu"),
                                                          ("wgpu", True, "wgpu")])
def test_a_software_adapter_is_passed_over_for_the_wasm_device_and_the_page_says_why(monkeypatch, requested,
                                                                                     wasm_runs, chosen):
    """The automatic choice on a software WebGPU adapter (SwiftShader, as Chromium describes it) is
    the wasm device, with the reason in the device note; where the wasm device cannot run, the
    software adapter is still better than pure Python; ?device=wgpu keeps the adapter. Natively the
    page's wasm driver is wasmtime's (tallow.Device("wasm")), and the adapter a NullDriver."""
    from tallow_wgpu import browser
    from tallow_wgpu.driver_null import NullDriver

    class SwiftShader(NullDriver):
        info = {"adapter": "SwiftShader Device (Subzero)", "vendor": "google", "architecture": "swiftshader",
                "backend_type": "WebGPU (browser)", "adapter_type": ""}
        cpu_emulated = False  # told from its info alone, as software_adapter does for adapter.info

    async def adapter():
        return SwiftShader()

    async def wasm_device():
        if not wasm_runs:
            raise tallow.errors.DeviceError("no SIMD128 here")
        return tallow.Device("wasm")

    if wasm_runs:
        try:
            tallow.Device("wasm")
        except tallow.errors.DeviceError as e:
            pytest.skip(str(e))
    monkeypatch.setattr(browser, "create_browser_driver", adapter)
    module = _fresh_worker()
    monkeypatch.setattr(module, "_wasm_device", wasm_device)
    import asyncio
    try:
        info = json.loads(asyncio.run(module.boot(True, None, requested)))
        assert tallow.Device("wgpu").backend.driver.info["adapter"] == "SwiftShader Device (Subzero)"
    finally:
        tallow.device.restore_backend("wgpu")
    assert info["device"] == chosen and info["gpu"]["cpu_emulated"] is True and info["measure_speed"] is True, info
    note = info["device_note"]
    if chosen == "wasm":
        assert note.startswith("WebGPU's adapter here (SwiftShader Device (Subzero)) is a software one that computes "
                               "on the CPU: running on the CPU (WebAssembly SIMD)") and info["wasm_error"] is None
    elif requested == "auto":
        assert "the WebAssembly device cannot run here (DeviceError: no SIMD128 here): running on the software " \
               "adapter" in note, note
    else:
        assert note is None and info["wasm_error"] is None


def test_cpu_speed_on_webgpu_fits_its_matrices_to_a_small_binding_limit(worker):
    """The boot's speed probe on WebGPU (SwiftShader in a page) runs under ?max_binding_mb=: a
    512x512 f32 matrix (1 MiB) would exceed a 384 KiB binding and fail the page's boot."""
    try:
        from tallow_wgpu.backend import WgpuBackend
        backend = WgpuBackend(max_binding=384 * 1024)
    except tallow.errors.DeviceError as e:
        pytest.skip(str(e))
    assert worker._probe_width(types.SimpleNamespace(backend=backend)) == 256  # 256 KiB fits, 320 would not
    assert worker._probe_width(types.SimpleNamespace(backend=types.SimpleNamespace())) == 512  # no limits: CPU
    saved = worker.state["device"]
    worker.state["device"] = tallow.device.use_backend("wgpu", backend)
    try:
        out = json.loads(worker.cpu_speed(0.05))
    finally:
        tallow.device.restore_backend("wgpu")
        worker.state["device"] = saved
    assert out["flops_per_s"] > 0 and out["device"] == "wgpu"
