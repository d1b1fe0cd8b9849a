"""The Python half of the demo's worker (worker.mjs imports this as `tallow_web_worker`).

worker.mjs calls these functions through callPromising (or as coroutines), so
pyodide.ffi.run_sync works inside them: the WebGPU driver needs it for
readback. Results go back as JSON text, so no proxies leak to JS.
"""
import asyncio
import json
import os
import time
import traceback
from array import array

import tallow

NO_SPEECH_THRESHOLD = 0.6  # transcribe()'s default no_speech_threshold

state = {"device": None, "device_info": None, "gpu_error": None, "models": {}, "driver": None}


def _json(value):
    return json.dumps(value)


DEVICES = ("auto", "wgpu", "wasm", "cpu", "python")  # what the page's ?device= may name
# Words in a WebGPU adapter's info that mean it computes on the CPU (Chrome's SwiftShader, Mesa's
# llvmpipe/lavapipe/softpipe, Windows' WARP "Microsoft Basic Render Driver"): the automatic choice
# runs the wasm device instead (faster on a CPU), and says so.
SOFTWARE_ADAPTERS = ("swiftshader", "llvmpipe", "lavapipe", "softpipe", "basic render driver", "software")


def software_adapter(gpu_info, cpu_emulated=False):
    """Whether a WebGPU adapter (its driver.info) is a CPU emulation rather than a GPU."""
    text = " ".join(str(gpu_info.get(k, "")) for k in ("adapter", "vendor", "architecture", "description")).lower()
    return bool(cpu_emulated) or any(word in text for word in SOFTWARE_ADAPTERS)


async def boot(want_gpu=True, max_binding_mb=None, requested="auto"):
    """Pick the device: WebGPU when the browser has a GPU adapter; the wasm device (kernels.wasm)
    without navigator.gpu, with a null adapter or with a software adapter (software_adapter: it
    computes on the CPU, slower there than wasm SIMD); numpy or pure Python where the wasm device
    cannot run. want_gpu=False (the page's ?cpu) skips WebGPU and wasm. requested: the page's
    ?device= (DEVICES); a device that cannot run here is said in info["device_note"] and the
    automatic choice runs instead, so a browser without WebGPU never fails to boot; the reason for
    passing over a software adapter is said there too.
    max_binding_mb: assume GPU bindings of at most this many MiB (the page's ?max_binding_mb=)."""
    info = {"tallow": tallow.__version__, "numpy": _has_numpy(), "requested": requested, "device_note": None}
    if requested not in DEVICES:
        info["device_note"] = (f"?device={requested} is not a device of this page ({', '.join(DEVICES)}): "
                               "chose automatically")
        requested = "auto"
    if requested == "cpu" and not info["numpy"]:
        info["device_note"] = "?device=cpu needs numpy, which this page could not load: running in pure Python"
        requested = "python"
    software = None  # (driver, Device) of a software WebGPU adapter the automatic choice passes over
    if want_gpu and requested in ("auto", "wgpu"):
        try:
            from tallow_wgpu.browser import create_browser_driver, register_device
            driver = await create_browser_driver()
            max_binding = None if max_binding_mb is None else int(float(max_binding_mb) * (1 << 20))
            dev = register_device(driver, max_binding)  # Device("wgpu") stays usable either way
            limits = dev.backend.limits
            emulated = software_adapter(driver.info, driver.cpu_emulated)
            info["gpu"] = {**driver.info, "f16": driver.has_f16, "cpu_emulated": emulated,
                           "max_storage_binding": limits["max_storage_binding"],
                           "adapter_max_storage_binding": driver.limits["max_storage_binding"],
                           "max_buffer": limits["max_buffer"]}
            if requested == "auto" and emulated:
                software = (driver, dev)
            else:
                state["driver"], state["device"] = driver, dev
        except tallow.errors.Error as e:  # no WebGPU or no adapter: say why in plain words and fall back
            state["gpu_error"] = str(e).removeprefix("wgpu device is not available: ")
        except Exception as e:  # a driver failure: name it, and fall back
            state["gpu_error"] = f"{type(e).__name__}: {e}"
        if requested == "wgpu" and state["device"] is None:
            info["device_note"] = f"?device=wgpu: WebGPU is not usable here ({state['gpu_error']}): running on the CPU"
    elif requested == "wgpu":
        info["device_note"] = "?device=wgpu and ?cpu contradict each other: ?cpu wins"
    # the wasm device (kernels.wasm, SIMD128): asked for, or the automatic choice where WebGPU has no
    # adapter or a software one (also when ?device=wgpu found none), when it works here (a browser
    # without wasm SIMD cannot compile the module). ?cpu keeps its old meaning: numpy or pure Python.
    if requested == "wasm" or (requested in ("auto", "wgpu") and want_gpu and state["device"] is None):
        try:
            state["device"] = await _wasm_device()
            if software is not None:
                info["device_note"] = (f"WebGPU's adapter here ({info['gpu']['adapter']}) is a software one that "
                                       "computes on the CPU: running on the CPU (WebAssembly SIMD), which is faster "
                                       "there; ?device=wgpu uses the adapter anyway")
        except Exception as e:  # say why, and fall back: to the software adapter, else to the CPU below
            state["wasm_error"] = f"{type(e).__name__}: {e}"
            if requested == "wasm":
                info["device_note"] = (f"?device=wasm: the WebAssembly device cannot run here "
                                       f"({state['wasm_error']}): chose automatically")
            elif software is not None:
                state["driver"], state["device"] = software
                info["device_note"] = (f"WebGPU's adapter here ({info['gpu']['adapter']}) is a software one, and "
                                       f"the WebAssembly device cannot run here ({state['wasm_error']}): "
                                       "running on the software adapter")
    info["wasm_error"] = state.get("wasm_error")
    if state["device"] is None:
        state["device"] = tallow.Device(requested if requested in ("cpu", "python") else
                                        "cpu" if info["numpy"] else "python")
    info["device"] = str(state["device"])
    info["gpu_error"] = state["gpu_error"]
    # The page estimates model speed from a measurement on the chosen device where that device is
    # the CPU, or WebGPU emulated on it (a real GPU is fast enough not to warn about).
    info["measure_speed"] = info["device"] != "wgpu" or info["gpu"]["cpu_emulated"]
    state["device_info"] = info
    return _json(info)


async def _wasm_device():
    """tallow.Device("wasm") over the page's BrowserWasmDriver, checked on one small product."""
    from tallow.backends.wasm.browser import create_wasm_driver, register_device
    driver = await create_wasm_driver()
    dev = register_device(driver)
    got = (tallow.ones(2, 8, device=dev) @ tallow.full((8, 3), 0.5, device=dev)).tolist()
    if got != [[4.0] * 3] * 2:
        tallow.device.restore_backend("wasm")
        raise tallow.errors.DeviceError(f"the wasm device's probe product came out {got}, not 4.0 everywhere")
    state["driver"] = driver
    return dev


def _has_numpy():
    try:
        import numpy  # noqa: F401  (present when the page could load it from a CDN)
        return True
    except ImportError:
        return False


def _device(name):
    if name in (None, "", "auto"):
        return state["device"]
    return tallow.Device(name)


def load_refusal(name, nbytes, device=None):
    """Why a model of nbytes (the manifest's size, or the picked files') cannot load on `device`
    (None: the page's), said before any download; None when it can. The wasm device's memory is
    wasm32's 4 GiB (tallow.backends.wasm.driver.too_large)."""
    try:
        dev = _device(device)
    except tallow.errors.Error:
        return None  # the load itself says why that device cannot run
    if dev is None or dev.type != "wasm":
        return None
    from tallow.backends.wasm.driver import too_large
    return too_large(nbytes, name)


def _forget(key):
    """Drop a loaded model before `key` is loaded again, so the new one can take its memory (the
    wasm device's ranges, GPU buffers) rather than both being held at once."""
    if state["models"].pop(key, None) is not None:
        import gc
        gc.collect()


def load_model(key, path, device=None):
    """Load a model from the worker's file system; `key` names it for later requests."""
    started = time.perf_counter()
    dev = _device(device)
    _forget(key)
    model = tallow.load_model(path, device=dev)
    state["models"][key] = model
    return _json({"key": key, "device": str(dev), "seconds": time.perf_counter() - started,
                  "kind": model.kind, **_speech_facts(model)})


def _js_driver(dev):
    """The page's driver behind dev when weights go to it from JS (WebGPU, wasm), else None."""
    driver = state["driver"]
    return driver if driver is not None and dev.type in ("wgpu", "wasm") and dev.backend.driver is driver else None


def _js_source(js_data, name):
    """A ByteSource over a JS ArrayBuffer/Uint8Array, or over a sliced file (worker.mjs's SlicedFile)."""
    from tallow.io import JsArrayBufferSource, JsSlicedSource
    if hasattr(js_data, "sliceBytes"):
        return JsSlicedSource(js_data, name)
    return JsArrayBufferSource(js_data, name)


def load_model_from_js(key, folder, weights_name, js_bytes, device=None):
    """Load a model whose weights file is a JS ArrayBuffer/Uint8Array or a sliced file (a Blob from the
    Cache API or a picked file, read in slices): only its header enters Python; on WebGPU each tensor
    is copied from JS straight into its GPU buffer. weights_name: a .gguf file (an LLM, tokenizer in
    its metadata), or the model.safetensors of a Whisper folder whose small files are in `folder`."""
    from tallow.io import open as open_weights
    from tallow.models.loader import load_gguf

    started = time.perf_counter()
    dev = _device(device)
    driver = _js_driver(dev)
    _forget(key)
    before = (driver.bytes_from_js, driver.bytes_from_python) if driver else (0, 0)
    source = _js_source(js_bytes, weights_name)
    if weights_name.lower().endswith(".gguf"):
        model = load_gguf(source, device=dev)
    elif weights_name.endswith(".safetensors"):
        from tallow.models import whisper
        model = whisper.load(folder, device=dev, weights=open_weights(source, format="safetensors"))
    else:
        raise tallow.errors.FormatError(f"{weights_name}: expected a .gguf or .safetensors weights file")
    state["models"][key] = model
    if driver and hasattr(driver, "flush"):
        driver.flush()  # the on-GPU conversions recorded while loading
    return _json({"key": key, "device": str(dev), "seconds": time.perf_counter() - started,
                  "kind": model.kind, **_speech_facts(model),
                  # where the bytes went: read from the JS buffer into Python (headers, CPU-side tensors),
                  # written to GPU buffers straight from JS, and from Python memory (tables the model builds)
                  "weights_bytes": source.size, "read_into_python": source.bytes_read,
                  "gpu_from_js": (driver.bytes_from_js - before[0]) if driver else 0,
                  "gpu_from_python": (driver.bytes_from_python - before[1]) if driver else 0})


def _speech_facts(model):
    """What the page needs to offer language and task: only multilingual Whisper models have a choice."""
    if model.kind != "whisper" or not model.is_multilingual:
        return {"multilingual": False}
    return {"multilingual": True, "languages": sorted(model.tokens.languages)}


def load_folder_from_js(key, folder, weight_names, js_files, device=None):
    """Load a Hugging Face folder picked from disk: its small files (config.json, tokenizer.json,
    model.safetensors.index.json...) are already in `folder`; its *.safetensors are sliced JS files
    (weight_names[i] -> js_files[i]) whose tensors go JS -> GPU like load_model_from_js's."""
    from tallow import io
    from tallow.models.loader import load_directory

    started = time.perf_counter()
    dev = _device(device)
    driver = _js_driver(dev)
    _forget(key)
    before = (driver.bytes_from_js, driver.bytes_from_python) if driver else (0, 0)
    sources = {name: _js_source(f, name) for name, f in zip(list(weight_names), list(js_files))}
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        def open_shard(name):
            if name not in sources:
                raise tallow.errors.FormatError(f"{index} lists shard {name!r}, which was not among the picked files")
            return io.open(sources[name], format="safetensors")
        weights = io.ShardedSafetensors(index, open_shard)
    elif "model.safetensors" in sources:
        weights = io.open(sources["model.safetensors"], format="safetensors")
    else:
        raise tallow.errors.FormatError("the picked folder has neither model.safetensors nor "
                                        "model.safetensors.index.json (pick a Hugging Face model folder)")
    if not os.path.exists(os.path.join(folder, "config.json")):
        raise tallow.errors.FormatError("the picked folder has no config.json (pick a Hugging Face model folder)")
    model = load_directory(folder, device=dev, weights=weights)
    state["models"][key] = model
    if driver and hasattr(driver, "flush"):
        driver.flush()
    return _json({"key": key, "device": str(dev), "seconds": time.perf_counter() - started,
                  "kind": model.kind,
                  "weights_bytes": sum(s.size for s in sources.values()),
                  "read_into_python": sum(s.bytes_read for s in sources.values()),
                  "gpu_from_js": (driver.bytes_from_js - before[0]) if driver else 0,
                  "gpu_from_python": (driver.bytes_from_python - before[1]) if driver else 0})


def forget_model(key):
    state["models"].pop(key, None)


def _model(key):
    model = state["models"].get(key)
    if model is None:
        raise tallow.errors.Error(f"model {key!r} is not loaded")
    return model


class _WindowStages:
    """Progress inside a 30 s window, which takes a minute or more on a slow device: tallow's
    transcribe() reports whole windows only, so for one call the model's encode and decode_step
    are wrapped (instance attributes over the methods, removed afterwards) to report "encoding"
    when the encoder starts and "decoding" with the tokens decoded so far (a fallback retry at a
    higher temperature starts the count again)."""

    NAMES = ("encode", "start", "decode_step")

    def __init__(self, model, report):
        self.model, self.report, self.tokens = model, report, 0

    def __enter__(self):
        model = self.model
        encode, start, decode_step = model.encode, model.start, model.decode_step

        def encoding(mel):
            self.report("encoding", 0)
            return encode(mel)

        def starting(features):
            self.tokens = 0
            return start(features)

        def decoding(ids, state, positions=(-1,)):
            logits = decode_step(ids, state, positions)
            self.tokens += 1
            self.report("decoding", self.tokens)
            return logits

        self.own = {name: vars(model)[name] for name in self.NAMES if name in vars(model)}
        model.encode, model.start, model.decode_step = encoding, starting, decoding
        return self

    def __exit__(self, *exc):
        for name in self.NAMES:  # back to the methods (or what the instance held before)
            if name in self.own:
                setattr(self.model, name, self.own[name])
            else:
                delattr(self.model, name)


def transcribe(key, audio, is_samples, on_segment, timestamps=True, on_progress=None, language=None, task="transcribe"):
    """audio: a Float32Array of 16 kHz mono samples (is_samples) or the bytes of a WAV file.
    timestamps=False decodes without timestamp tokens: one segment per 30 s window.
    on_progress gets JSON {stage, done_s, duration, elapsed_s, left_s, tokens}: stage "audio" once the
    audio is read (its duration: the page's estimate), "encoding" and "decoding" (tokens so far)
    inside each window, "window" after each 30 s window: left_s extrapolates the time per second of
    audio so far. language/task: for multilingual models (None: detect the language)."""
    from tallow.models.whisper_transcribe import transcribe as run

    model = _model(key)
    if is_samples:
        samples = array("f")
        samples.frombytes(audio.to_bytes())
    else:
        samples = tallow.audio.load_audio(audio.to_bytes())  # WAV errors name the problem
    if not len(samples):
        raise tallow.errors.Error("the audio is empty (0 samples): record or pick a longer clip")
    duration = len(samples) / 16000
    started = time.perf_counter()

    def segment(seg):
        on_segment(_json({"start": seg.start, "end": seg.end, "text": seg.text}))

    done = [0.0]  # seconds of audio done: where the current window starts

    def report(stage, tokens=0):
        if on_progress is None:
            return
        elapsed = time.perf_counter() - started
        left = elapsed / done[0] * (duration - done[0]) if done[0] > 0 else None
        on_progress(_json({"stage": stage, "done_s": done[0], "duration": duration, "elapsed_s": elapsed,
                           "left_s": left, "tokens": tokens}))

    def window(done_s):
        done[0] = min(done_s, duration)
        report("window")

    report("audio")
    with _WindowStages(model, report):
        result = run(model, samples, timestamps=timestamps, on_segment=segment, on_window=window,
                     language=language or None, task=task or "transcribe")
    seconds = time.perf_counter() - started
    segments = [{"start": s.start, "end": s.end, "text": s.text, "no_speech_prob": s.no_speech_prob}
                for s in result.segments if s.text.strip()]
    text = result.text.strip()
    # Whisper "hears" a word or two in silence (tiny.en: " you") yet rates the window as probably
    # not speech: when every segment is rated so, the page says no speech instead of the guess.
    no_speech = not text or all(s["no_speech_prob"] > NO_SPEECH_THRESHOLD for s in segments)
    return _json({"text": text, "no_speech": no_speech, "duration": duration, "seconds": seconds,
                  "language": result.language, "rtf": seconds / duration if duration else None,
                  "segments": segments})


SAMPLING = ("temperature", "top_p", "seed", "stop")  # what tallow.mjs's chat.completions.create passes on


async def chat(key, messages_json, max_tokens, on_token, is_stopped, on_prefill=None, options_json=None):
    """Stream a reply (greedy unless options_json sets temperature; also top_p, seed, stop); between
    tokens yield to the event loop so a Stop message is seen. A prompt that leaves no room for
    max_tokens raises ContextWindowError before any compute (tallow.mjs: context_length_exceeded).
    on_prefill gets JSON {prompt_tokens} before the prompt is read (one forward pass: the page
    shows it with an estimate). on_token(text, json) gets each piece with the decode rate so far:
    tokens after the first / seconds since the first, so the prompt's time is not counted."""
    from tallow.generation import chat as run_chat, chat_prompt_ids

    model = _model(key)
    messages = json.loads(messages_json)
    options = json.loads(options_json) if options_json else {}
    unknown = sorted(set(options) - set(SAMPLING))
    if unknown:
        raise tallow.errors.Error(f"chat: unknown options {unknown} (known: {', '.join(SAMPLING)})")
    max_tokens = int(max_tokens)
    prompt_tokens = len(chat_prompt_ids(model, messages))
    window = model.context_window
    if prompt_tokens + max_tokens > window:
        raise tallow.errors.ContextWindowError(
            f"this model's context window is {window} tokens, and the request needs {prompt_tokens + max_tokens} "
            f"({prompt_tokens} in the messages, max_tokens {max_tokens}): shorten the messages or ask for fewer tokens")
    if on_prefill is not None:
        on_prefill(_json({"prompt_tokens": prompt_tokens}))
        await asyncio.sleep(0)  # let the message out before the long forward pass
    started = time.perf_counter()
    first = None
    pieces = []
    stream = run_chat(model, messages, stream=True, max_tokens=max_tokens, **options)
    stopped = False
    for n, piece in enumerate(stream):
        now = time.perf_counter()
        if first is None:
            first = now
        pieces.append(piece)
        rate = n / (now - first) if n and now > first else None
        on_token(piece, _json({"n": n + 1, "decode_tokens_per_s": rate, "first_token_s": first - started}))
        await asyncio.sleep(0)  # lets the worker's onmessage run (Stop)
        if is_stopped():
            stopped = True
            break
    state["last_chat_ids"] = list(stream.token_ids)
    return _json({"text": "".join(pieces), "stopped": stopped, "seconds": time.perf_counter() - started,
                  "first_token_s": (first - started) if first else None, "token_ids": list(stream.token_ids),
                  "prompt_tokens": stream.prompt_tokens, "prefill_tokens_per_s": stream.prefill_tokens_per_second,
                  "tokens_per_s": stream.decode_tokens_per_second,
                  "finish_reason": "stopped" if stopped else stream.finish_reason})


def _probe_width(dev, widest=512):
    """The square matrix's width for the speed probe: 512, or less where one f32 matrix would pass
    WebGPU's storage binding limit (the page's ?max_binding_mb=, or a small adapter): a plain
    tensor is never split across bindings, so a larger one would fail the probe and the boot."""
    limits = getattr(dev.backend, "limits", None)
    if not limits:
        return widest
    fits = int((limits["max_storage_binding"] // 4) ** 0.5) // 64 * 64
    return max(64, min(widest, fits))


def cpu_speed(seconds=0.3):
    """FLOP/s of f32 matmuls on the chosen device: the page turns it into an up-front estimate of
    how slow each model will be here. Decode-shaped (a few rows times a square matrix, the slow
    case per FLOP); pure Python gets a small one, other devices a larger chain of four per readback,
    so a WebGPU readback's fixed cost does not stand in for its speed."""
    dev = state["device"]
    m, n, chain = (4, 128, 1) if dev.type == "python" else (4, _probe_width(dev), 4)
    a = tallow.ones(m, n, device=dev)
    b = tallow.full((n, n), 1.0 / n, device=dev)  # keeps a chain's values at 1
    runs, started = 0, time.perf_counter()
    while True:
        x = a
        for _ in range(chain):
            x = x @ b
        x.tolist()
        runs += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds or runs >= 50:
            flops = 2 * m * n * n * chain * runs
            return _json({"flops_per_s": flops / elapsed, "device": str(dev), "seconds": elapsed})


def describe_error(exc):
    """A readable one-line message for the page, plus the traceback for the console."""
    name = type(exc).__name__
    return _json({"message": f"{name}: {exc}", "traceback": "".join(traceback.format_exception(exc))})


def write_file(path, data):
    """Put a JS ArrayBuffer/Uint8Array into the worker's file system (model files)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.to_bytes())
