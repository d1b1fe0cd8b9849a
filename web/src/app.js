// The page: talks to worker.mjs through tallow.mjs (the OpenAI-shaped API any page may import) and
// never runs Python itself.
import { prepareFile, startRecording } from "./audio.js";
import { TallowClient } from "./tallow.mjs";
import { transcriptAs } from "./transcript.js";

const $ = (id) => document.getElementById(id);
// Options the worker reads: ?cpu, ?device=wgpu|wasm|cpu|python (overrides the automatic choice),
// ?threads=N (the wasm device's threads where the page is cross-origin isolated),
// and the big-model knobs ?slice_mb= / ?max_binding_mb= (tests lower them).
const workerOptions = {};
for (const [name, value] of new URL(location.href).searchParams) {
  if (["cpu", "device", "threads", "slice_mb", "max_binding_mb"].includes(name)) workerOptions[name] = value || "1";
}
const client = new TallowClient({ workerOptions, onProgress: (msg) => showProgress(msg, activePanel()) });

const panels = new Map(); // running request -> the panel that asked: where the worker's progress goes
let panelCount = 0;
const loaded = new Map(); // model key -> load info
const progressOf = new Map(); // model key -> {state, storage}: the table's cells while it loads
let manifest = { models: {} };
let site = {};
let info = null;
let cacheState = { models: {} };
let resolveReady;
const ready = new Promise((r) => (resolveReady = r));

// Where progress goes: the status line next to the control that started the work (a phone
// shows the panel the user is in, not the top of the page).
const statusOf = { speech: "speech-status", chat: "chat-status", models: "status" };

function activePanel() {
  return panels.size ? panels.values().next().value : "models";
}

// A request of the panel's: its progress shows there while it runs, and a "queued" answer says so
// next to the control that made it; a failure's traceback goes to the console.
function tracked(panel, promise) {
  promise.catch((e) => console.warn(e.traceback || e.message));
  if (!panel) return promise;
  const key = ++panelCount;
  panels.set(key, panel);
  promise.finally(() => panels.delete(key)).catch(() => {});
  return promise;
}

function events(panel, onEvent = null) {
  return (msg) => {
    if (msg.type === "queued" && panel) {
      setStatus(msg.booting ? "Queued: Python is still starting; this runs as soon as it is ready." :
        `Queued behind ${msg.ahead} earlier request${msg.ahead === 1 ? "" : "s"}; it runs when ${msg.ahead === 1 ? "that finishes" : "they finish"}.`, panel);
    }
    if (onEvent) onEvent(msg);
  };
}

// request(type, fields, onEvent, transfer, panel) -> Promise of the worker's result value.
function request(type, fields = {}, onEvent = null, transfer = [], panel = null) {
  return tracked(panel, client.request(type, fields, { onEvent: events(panel, onEvent), transfer }));
}

function showError(message) {
  $("error-text").textContent = message;
  $("error").hidden = false;
}
$("error-dismiss").onclick = () => ($("error").hidden = true);

function setStatus(text, panel = "models", failed = false) {
  const el = $(statusOf[panel] || "status");
  el.textContent = text;
  el.classList.toggle("failed", failed);
}

function mb(bytes) {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

// Where a model runs, in plain words (the worker says wgpu, wasm, cpu or python).
function deviceName(device) {
  return device === "wgpu" ? "WebGPU" : device === "wasm" ? "the CPU (WebAssembly SIMD)" :
    device === "cpu" ? "the CPU (numpy)" : "the CPU (pure Python)";
}

function duration(seconds) {
  if (seconds < 90) return `${Math.max(1, Math.round(seconds))} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function showProgress(msg, panel) {
  if (msg.boot) {
    $("status").textContent = msg.total ? `${msg.stage}: ${mb(msg.loaded)} of ${mb(msg.total)}` : `${msg.stage}…`;
    $("progress").hidden = !msg.total;
    if (msg.total) $("progress").value = msg.loaded / msg.total;
    return;
  }
  const file = msg.file ? ` (${msg.file.name}: ${mb(msg.file.loaded)} of ${mb(msg.file.total)}${msg.file.parts ? `, ${msg.file.parts} parts` : ""})` : "";
  const text = msg.total ? `${msg.stage}: ${mb(msg.loaded)} of ${mb(msg.total)}${file}` : `${msg.stage}…`;
  setStatus(text, panel);
  if (msg.model) {
    // the table follows the load: its state, and the storage column while files download
    const live = { state: msg.total ? `${mb(msg.loaded)} of ${mb(msg.total)}` : msg.stage,
                   storage: msg.stage.startsWith("Downloading") ? `downloading (${mb(msg.loaded)} of ${mb(msg.total)})` : null };
    progressOf.set(msg.model, live);
    const row = document.querySelector(`#models tr[data-model="${msg.model}"]`);
    if (row) {
      row.querySelector(".state").textContent = live.state;
      if (live.storage) row.querySelector(".storage").textContent = live.storage;
    }
    refreshCacheSoon();
  }
  const bar = panel === "speech" ? $("speech-progress") : panel === "models" ? $("progress") : null;
  if (bar) {
    bar.hidden = !msg.total;
    if (msg.total) bar.value = msg.loaded / msg.total;
  }
}

client.ready.then(() => {
  info = client.info;
  manifest = client.manifest;
  site = client.site;
  $("progress").hidden = true;
  showDevice();
  showModels();
  refreshCache();
  $("status").textContent = `Ready in ${info.ready_s.toFixed(1)} s (Pyodide ${info.pyodide}, tallow ${info.tallow}, ` +
    `${mb(info.runtime_bytes)} downloaded).`;
  enableControls();
  showChatModels();
  document.body.dataset.ready = "1";
  resolveReady(info);
}, (err) => {
  $("status").textContent = "Python failed to start.";
  for (const panel of ["speech", "chat"]) setStatus("Python failed to start: this panel cannot work (see the error).", panel, true);
  showError(err.message);
  console.warn(err.traceback);
});

const CONTROLS = ["open-model", "open-folder", "example", "audio-file", "record", "timestamps", "language", "task",
                  "chat-input", "max-tokens", "send", "reset"];
function enableControls() {
  for (const id of CONTROLS) $(id).disabled = false;
  const speech = modelOfKind("whisper");
  setStatus(speech ? cpuWarning("whisper") || "Ready: try the example clip, pick a file or record." :
    "No speech model on this site: run `tallow fetch whisper-tiny.en` and rebuild.", "speech");
  const chat = modelOfKind("llm");
  setStatus(chat ? cpuWarning("llm") || "Ready: type a message." :
    "No chat model on this site: run `tallow fetch smollm2-135m-instruct` and rebuild.", "chat");
  showLanguageChoice();
}

// ---- without WebGPU: say up front what will be slow -------------------------------------------
// manifest cost (FLOPs of the work, from web/build.py) / the FLOP/s the worker measured at boot.
function estimateSeconds(kind, amount) {
  if (!info || !info.cpu_speed) return null;
  const key = modelOfKind(kind);
  const cost = key && manifest.models[key] && manifest.models[key].cost;
  if (!cost) return null;
  const flops = kind === "whisper" ? cost.flops_per_window * Math.max(1, Math.ceil(amount / 30)) : cost.flops_per_token * amount;
  return flops / info.cpu_speed.flops_per_s;
}

// "No WebGPU" or, on an adapter that computes on the CPU (SwiftShader, llvmpipe), "WebGPU is emulated"
// (the automatic choice then runs the wasm device; ?device=wgpu runs the adapter: softwareGpu()).
const emulatedGpu = () => !!(info && info.gpu && info.gpu.cpu_emulated);
const softwareGpu = () => emulatedGpu() && info.device === "wgpu";

function cpuWarning(kind) {
  if (!info || !info.cpu_speed) return "";
  const s = kind === "whisper" ? estimateSeconds("whisper", 30) : estimateSeconds("llm", 64 + 30);
  if (s === null) return "";
  const where = emulatedGpu() ? "WebGPU is emulated on the CPU here" : "No WebGPU";
  return kind === "whisper" ?
    `${where}: on this CPU 30 s of speech takes about ${duration(s)}. It still runs when asked (one request at a time).` :
    `${where}: on this CPU a 64-token reply takes about ${duration(s)}. It still runs when asked (one request at a time).`;
}

function showDevice() {
  const rows = [["Python", `Pyodide ${info.pyodide}, tallow ${info.tallow}${info.numpy ? ", numpy" : ""}`],
                ["compute", info.device === "wgpu" ? "WebGPU" :
                  `CPU (${info.device === "wasm" ? "WebAssembly SIMD" : info.device === "cpu" ? "numpy" : "pure Python"})`]];
  if (info.gpu) {
    rows.push(["adapter", `${info.gpu.adapter}${info.gpu.vendor ? ` (${info.gpu.vendor})` : ""}${info.gpu.cpu_emulated ? " — emulated on the CPU" : ""}`]);
    rows.push(["f16", info.gpu.f16 ? "yes (shader-f16)" : "no: f16 weights run as f32"]);
  } else {
    rows.push(["WebGPU", `not available, running on the CPU fallback: ${info.gpu_error || "disabled"}`]);
  }
  if (info.device_note) rows.push(["device choice", info.device_note]);
  if (info.cpu_speed_error) rows.push(["CPU speed", `not measured (${info.cpu_speed_error})`]);
  if (info.cpu_speed) {
    rows.push(["CPU speed", `${(info.cpu_speed.flops_per_s / 1e6).toFixed(0)} MFLOP/s (measured: small matmuls on ${deviceName(info.cpu_speed.device)})`]);
  }
  $("device").innerHTML = "";
  for (const [k, v] of rows) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    $("device").append(dt, dd);
  }
  $("device").dataset.device = info.device;
  const note = $("cpu-note");
  const warnings = [cpuWarning("whisper"), cpuWarning("llm")].filter(Boolean);
  note.hidden = !warnings.length;
  const computes = softwareGpu() ? "WebGPU here is emulated on the CPU, so this page computes at CPU speed." :
    emulatedGpu() ? `WebGPU here is emulated on the CPU, so this page computes on ${deviceName(info.device)}.` :
    `Without WebGPU this page computes on ${deviceName(info.device)}.`;
  note.textContent = warnings.length ? `${computes} ` +
    `${warnings.map((w) => w.replace(/^[^:]*: on/, "On")).join(" ")} ` +
    "Use Chrome or Edge with WebGPU on a GPU for usable speed." : "";
}

function storageText(key, m) {
  const c = cacheState.models[key];
  if (m.missing) return "—";
  if (!c || !c.bytes) return "not downloaded";
  return c.files === c.of ? `cached (${mb(c.bytes)})` : `partly cached (${mb(c.bytes)} of ${mb(m.bytes)})`;
}

function showModels() {
  const body = $("models").querySelector("tbody");
  body.innerHTML = "";
  for (const [key, m] of Object.entries(manifest.models)) {
    const tr = document.createElement("tr");
    tr.dataset.model = key;
    const l = loaded.get(key);
    // the load time is the one the status line gave: from the request to the model being ready
    const live = !l && progressOf.get(key);
    const state = l ? `loaded on ${deviceName(l.device)} in ${l.load_s.toFixed(1)} s` : live ? live.state : m.missing || "not loaded";
    tr.innerHTML = '<td><span class="title"></span><span class="size"></span></td><td class="storage"></td>' +
      '<td><span class="state"></span><span class="actions"></span></td>';
    tr.querySelector(".title").textContent = m.title;
    tr.querySelector(".size").textContent = m.bytes ? mb(m.bytes) : "size unknown";
    tr.querySelector(".storage").textContent = key.startsWith("local-") ? "from disk" :
      (live && live.storage) || storageText(key, m);
    tr.querySelector(".state").textContent = state;
    const actions = tr.querySelector(".actions");
    if (!m.missing && !l) {
      const b = document.createElement("button");
      b.textContent = "Load";
      b.setAttribute("aria-label", `Load ${m.title}`);
      b.disabled = !info;
      b.onclick = () => ensureModel(key, "models").catch((e) => fail(e, "models"));
      actions.append(b);
    }
    const c = cacheState.models[key];
    if (c && c.bytes) {
      const d = document.createElement("button");
      d.textContent = "Delete";
      d.setAttribute("aria-label", `Delete the cached files of ${m.title}`);
      d.onclick = () => deleteCached(key).catch((e) => fail(e, "models"));
      actions.append(d);
    }
    body.append(tr);
  }
}

// At most one cache-list a second while a download reports progress (each finished part shows).
let refreshTimer = null;
function refreshCacheSoon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => {
    refreshCache().catch(() => {}).finally(() => (refreshTimer = null));
  }, 1000);
}

async function refreshCache() {
  cacheState = await request("cache-list");
  $("storage").textContent = cacheState.usage !== null ?
    `Browser storage used by this site: ${mb(cacheState.usage)}${cacheState.quota ? ` of ${mb(cacheState.quota)} allowed` : ""}.` : "";
  showModels();
  return cacheState;
}

async function deleteCached(key) {
  const r = await request("cache-delete", { model: key });
  await refreshCache();
  setStatus(`Deleted ${r.deleted} cached file${r.deleted === 1 ? "" : "s"} of ${manifest.models[key].title}` +
    (loaded.has(key) ? " (it stays loaded until the page is reloaded)." : "."));
}

const loading = new Map();
function ensureModel(key, panel) {
  if (!loading.has(key)) {
    const p = tracked(panel, client.load(key, { onEvent: events(panel) })).then((v) => {
      progressOf.delete(key);
      loaded.set(key, v);
      showModels();
      showChatModels();
      setStatus(`${manifest.models[key].title} loaded on ${deviceName(v.device)} in ${v.load_s.toFixed(1)} s` +
        `${v.from_cache === v.bytes ? " (files from browser storage)" : ` (${mb(v.bytes - v.from_cache)} downloaded)`}.`, panel);
      $("progress").hidden = true;
      showLanguageChoice();
      refreshCache().catch(() => {});
      return v;
    });
    p.catch(() => {
      loading.delete(key);
      progressOf.delete(key);
      showModels();
    });
    loading.set(key, p);
  }
  return loading.get(key);
}

function modelOfKind(kind) {
  for (const key of loaded.keys()) if (loaded.get(key).kind === kind && key.startsWith("local-")) return key;
  return Object.keys(manifest.models).find((k) => manifest.models[k].kind === kind && !manifest.models[k].missing);
}

function fail(e, panel) {
  setStatus(`Failed: ${e.message.split("\n")[0].slice(0, 200)}`, panel, true);
  showError(e.message);
}

function guarded(fn, panel) {
  return (...args) => fn(...args).catch((e) => fail(e, panel));
}

// ---- speech -------------------------------------------------------------------
function showLanguageChoice() {
  const key = modelOfKind("whisper");
  const l = key && loaded.get(key);
  const multilingual = l ? l.multilingual : !!(key && manifest.models[key].multilingual);
  $("multilingual").hidden = !multilingual;
  if (l && l.languages && $("language").options.length !== l.languages.length + 1) {
    $("language").innerHTML = '<option value="">detect</option>';
    for (const code of l.languages) $("language").append(new Option(code, code));
  }
  if (key) $("speech-model").textContent = manifest.models[key].title;
}

let lastTranscript = null;
let speechBusy = 0;
const secondsPerWindow = new Map(); // device -> the last transcription's seconds per 30 s window there

// Seconds a transcription of this much audio should take: the last run on this device when there
// was one (30 s windows cost about the same whatever they hold), else the CPU measured at boot.
function speechEstimate(audioSeconds, device) {
  const windows = Math.max(1, Math.ceil(audioSeconds / 30));
  if (secondsPerWindow.has(device)) return secondsPerWindow.get(device) * windows;
  return device === "wgpu" && !softwareGpu() ? null : estimateSeconds("whisper", audioSeconds);
}

// audio: WAV bytes or 16 kHz samples (a Float32Array), as audio.js's prepareFile gives them.
async function transcribe(audio, label) {
  const key = modelOfKind("whisper");
  if (!key) throw new Error("no speech model on this site: run `tallow fetch whisper-tiny.en` and rebuild");
  speechBusy += 1;
  const shown = $("transcript");
  $("segments").innerHTML = "";
  $("timings").hidden = true;
  shown.textContent = "";
  delete shown.dataset.done;
  $("speech-stats").textContent = "";
  $("export").hidden = true;
  try {
    if (!loaded.has(key)) await ensureModel(key, "speech");
    const device = loaded.get(key).device;
    let estimate = null;
    setStatus(`Transcribing ${label}…`, "speech");
    const bar = $("speech-progress");
    bar.hidden = false;
    bar.removeAttribute("value"); // indeterminate until the worker has read the audio
    const onEvent = (msg) => {
      if (msg.type === "segment") {
        // the text grows as each part is decoded; the times go to the list under it
        shown.textContent += msg.segment.text;
        const li = document.createElement("li");
        li.textContent = `[${msg.segment.start.toFixed(2)} → ${msg.segment.end.toFixed(2)}] ${msg.segment.text.trim()}`;
        $("segments").append(li);
      } else if (msg.type === "window") {
        if (msg.stage === "audio") estimate = speechEstimate(msg.duration, device);
        const left = msg.left_s !== null ? msg.left_s : estimate !== null ? Math.max(0, estimate - msg.elapsed_s) : null;
        const leftText = left !== null && msg.done_s < msg.duration ? `, about ${duration(left)} left` : "";
        const done = `${msg.done_s.toFixed(0)} of ${msg.duration.toFixed(0)} s of audio done${leftText}`;
        // Inside a window: the encoder hears up to 30 s, then the decoder writes its text token by
        // token. Speech runs 3-4 tokens a second: a guess that keeps the bar moving (the line
        // gives the true count).
        const windowSeconds = Math.min(30, msg.duration - msg.done_s);
        const within = msg.stage === "decoding" ? Math.min(0.9, msg.tokens / Math.max(8, 4 * windowSeconds)) : 0;
        bar.value = Math.min(1, (msg.done_s + within * windowSeconds) / msg.duration);
        if (msg.stage === "audio") {
          setStatus(`Transcribing ${label} (${duration(msg.duration)} of audio)` +
            `${estimate !== null ? `: about ${duration(estimate)} on ${deviceName(device)}` : ""}…`, "speech");
        } else if (msg.stage === "encoding") {
          setStatus(`Transcribing ${label}: ${done}; listening to the next ${duration(windowSeconds)}…`, "speech");
        } else if (msg.stage === "decoding") {
          setStatus(`Transcribing ${label}: ${done}; writing it down, ${msg.tokens} word piece${msg.tokens === 1 ? "" : "s"} so far…`, "speech");
        } else {
          setStatus(`Transcribing ${label}: ${done}.`, "speech");
        }
      } else if (msg.type === "started") {  // after "Queued…": it runs now
        setStatus(`Transcribing ${label}…`, "speech");
      }
    };
    const language = $("multilingual").hidden ? null : $("language").value || null;
    const task = $("multilingual").hidden ? "transcribe" : $("task").value;
    const api = task === "translate" ? client.audio.translations : client.audio.transcriptions;
    const r = (await tracked("speech", api.create({ file: audio, model: key, response_format: "verbose_json", language },
      { onEvent: events("speech", onEvent), timestamps: $("timestamps").checked }))).tallow;
    bar.hidden = true;
    lastTranscript = r;
    secondsPerWindow.set(device, r.seconds / Math.max(1, Math.ceil(r.duration / 30)));
    shown.textContent = r.no_speech ? (r.text ? `No speech detected (the model rates it as probably not speech; ` +
      `its guess was “${r.text}”).` : "No speech detected.") : r.text;
    shown.dataset.noSpeech = r.no_speech ? "1" : "";
    shown.dataset.done = "1";
    $("export").hidden = r.no_speech;
    if (r.no_speech) $("segments").innerHTML = ""; // the guesses streamed in while it ran
    $("timings").hidden = r.no_speech || !$("segments").children.length;
    const ratio = r.rtf >= 1 ? `it took ${r.rtf.toFixed(1)}x as long as the audio lasts` :
      `${(1 / r.rtf).toFixed(1)}x quicker than the audio lasts`;
    $("speech-stats").textContent = `${r.duration.toFixed(1)} s of audio in ${r.seconds.toFixed(1)} s on ${deviceName(device)}: ${ratio}.`;
    setStatus(r.no_speech ? `No speech detected in ${label}.` : `Transcribed ${label}: ${r.segments.length} segment${r.segments.length === 1 ? "" : "s"}.`, "speech");
    return r;
  } finally {
    speechBusy -= 1;
    if (!speechBusy) $("speech-progress").hidden = true;
  }
}

function preview(blob) {
  const audio = $("preview");
  if (audio.src) URL.revokeObjectURL(audio.src);
  audio.src = URL.createObjectURL(blob);
  audio.hidden = false;
}

async function transcribeFile(file) {
  const bytes = await file.arrayBuffer();
  const fields = await prepareFile(file.name, bytes);
  preview(file);
  return transcribe(fields.audio, file.name);
}

$("example").onclick = guarded(async () => {
  setStatus("Fetching the example clip…", "speech");
  const r = await fetch(site.example);
  if (!r.ok) throw new Error(`${site.example}: HTTP ${r.status} (the site was built without its example clip)`);
  const name = site.example.split("/").pop();
  await transcribeFile(new File([await r.blob()], name, { type: "audio/wav" }));
}, "speech");
$("audio-file").onchange = guarded(async (ev) => {
  const file = ev.target.files[0];
  ev.target.value = "";
  if (file) await transcribeFile(file);
}, "speech");
const drop = $("drop");
drop.ondragover = (ev) => { ev.preventDefault(); drop.classList.add("over"); };
drop.ondragleave = () => drop.classList.remove("over");
drop.ondrop = guarded(async (ev) => {
  ev.preventDefault();
  drop.classList.remove("over");
  const file = ev.dataTransfer.files[0];
  if (file && info) await transcribeFile(file);
  else if (file) throw new Error("Python is still starting: drop the file again when the page says Ready");
}, "speech");
let recorder = null;
$("record").onclick = guarded(async () => {
  const button = $("record");
  if (!recorder) {
    recorder = await startRecording();
    button.textContent = "■ Stop and transcribe";
    button.classList.add("recording");
    setStatus("Recording… press Stop and transcribe when done.", "speech");
    return;
  }
  const r = recorder;
  recorder = null;
  button.textContent = "● Record from the microphone";
  button.classList.remove("recording");
  const samples = await r.stop();
  preview(wavBlob(samples));
  await transcribe(samples, "the recording");
}, "speech");

// 16-bit PCM WAV of 16 kHz samples, for the audio preview of a recording.
function wavBlob(samples) {
  const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const text = (at, s) => [...s].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVEfmt ");
  view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, 16000, true); view.setUint32(28, 32000, true); view.setUint16(32, 2, true);
  view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, samples.length * 2, true);
  samples.forEach((v, i) => view.setInt16(44 + i * 2, Math.max(-1, Math.min(1, v)) * 0x7fff, true));
  return new Blob([view], { type: "audio/wav" });
}

$("copy").onclick = guarded(async () => {
  const text = transcriptAs(lastTranscript, "txt");
  try {
    await navigator.clipboard.writeText(text);
    setStatus("Transcript copied to the clipboard.", "speech");
  } catch (err) {  // no clipboard permission: select the text so the user can copy it
    getSelection().selectAllChildren($("transcript"));
    setStatus("The browser refused clipboard access: the transcript is selected, press Ctrl+C (⌘C) to copy it.", "speech");
  }
}, "speech");
for (const button of $("export").querySelectorAll("button[data-format]")) {
  button.onclick = () => {
    const format = button.dataset.format;
    const types = { txt: "text/plain", srt: "application/x-subrip", vtt: "text/vtt", json: "application/json" };
    const url = URL.createObjectURL(new Blob([transcriptAs(lastTranscript, format)], { type: `${types[format]};charset=utf-8` }));
    const a = document.createElement("a");
    a.href = url;
    a.download = `transcript.${format}`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  };
}

// ---- chat ---------------------------------------------------------------------
let history = [];
let chatAbort = null; // the running reply's AbortController: Stop aborts it
let lastPrefillRate = null; // prompt tokens/s of the previous reply: the next prefill's estimate

$("chat-form").onsubmit = guarded(async (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chatAbort !== null) return;
  const key = $("chat-model").value || modelOfKind("llm");
  if (!key) throw new Error("no chat model on this site: run `tallow fetch smollm2-135m-instruct` and rebuild, or open a .gguf");
  $("chat-input").value = "";
  const user = document.createElement("div");
  user.className = "user";
  user.textContent = text;
  const reply = document.createElement("div");
  reply.className = "assistant";
  $("chat-log").append(user, reply);
  history.push({ role: "user", content: text });
  $("send").disabled = true;
  $("reset").disabled = true;
  try {
    if (!loaded.has(key)) await ensureModel(key, "chat");
    $("stop").disabled = false;
    const maxTokens = Number($("max-tokens").value) || 64;
    const onEvent = (msg) => {
      if (msg.type === "prefill") {
        // prompt tokens/s: the last reply's, else (no WebGPU) the CPU measured at boot; a model
        // opened from disk has no cost in the manifest, so its first prompt has no estimate
        const cost = manifest.models[key].cost;
        const rate = lastPrefillRate || (info.cpu_speed && cost ? info.cpu_speed.flops_per_s / cost.flops_per_token : null);
        setStatus(`Reading your ${msg.prompt_tokens}-token prompt${rate ? ` (about ${duration(msg.prompt_tokens / rate)})` : ""}…`, "chat");
      } else if (msg.type === "token") {
        const rate = msg.decode_tokens_per_s ? `, ${msg.decode_tokens_per_s.toFixed(2)} tokens/s` : "";
        setStatus(`Generating: ${msg.n} of at most ${maxTokens} tokens${rate} (first token after ${msg.first_token_s.toFixed(1)} s).`, "chat");
      }
    };
    chatAbort = new AbortController();
    const stream = await tracked("chat", client.chat.completions.create(
      { model: key, messages: history, max_tokens: maxTokens, temperature: 0, stream: true },
      { signal: chatAbort.signal, onEvent: events("chat", onEvent) }));
    let r = null;
    for await (const chunk of stream) {
      const delta = chunk.choices[0].delta.content;
      if (delta) reply.textContent += delta;
      if (chunk.tallow) r = chunk.tallow; // the last chunk: the worker's timings
    }
    history.push({ role: "assistant", content: r.text });
    reply.dataset.done = "1";
    if (r.prefill_tokens_per_s) lastPrefillRate = r.prefill_tokens_per_s;
    $("chat-stats").textContent = `${r.token_ids.length} tokens, ${r.tokens_per_s.toFixed(2)} tokens/s after a ${r.prompt_tokens}-token prompt ` +
      `(${r.prefill_tokens_per_s.toFixed(1)} tokens/s), ${r.finish_reason} (on ${deviceName(loaded.get(key).device)})`;
    setStatus(r.stopped ? "Stopped." : "Done.", "chat");
  } catch (e) {
    history.pop();
    reply.dataset.done = "error";
    throw e;
  } finally {
    chatAbort = null;
    $("send").disabled = false;
    $("reset").disabled = false;
    $("stop").disabled = true;
  }
}, "chat");
$("stop").onclick = () => {
  if (chatAbort !== null) chatAbort.abort();
};
$("reset").onclick = () => {
  history = [];
  $("chat-log").innerHTML = "";
  $("chat-stats").textContent = "";
  setStatus("New chat: the model has forgotten the conversation.", "chat");
  $("chat-input").focus();
};

// ---- the chat model list, and models opened from disk ----------------------------
// Every chat model by name and size: the site's own, plus .gguf files and Hugging Face folders
// opened from disk. Picked files are posted to the worker as File objects (no copy, nothing read
// here): the worker reads them in slices, so files over 2 GB load too.
function showChatModels() {
  const select = $("chat-model");
  const chosen = select.value;
  select.innerHTML = "";
  for (const [key, m] of Object.entries(manifest.models)) {
    if (m.kind !== "llm" || m.missing) continue;
    const option = document.createElement("option");
    option.value = key;
    option.textContent = `${m.title} — ${m.bytes ? mb(m.bytes) : "size unknown"}${loaded.has(key) ? " (loaded)" : ""}`;
    select.append(option);
  }
  if (chosen && manifest.models[chosen]) select.value = chosen;
}

let localCount = 0;
async function openFromDisk(files, title) {
  if (!files.length) return null;
  const key = `local-${++localCount}`;
  const bytes = files.reduce((s, f) => s + f.size, 0);
  setStatus(`Loading ${title} (${mb(bytes)})…`);
  // A folder's files keep their own names (webkitRelativePath holds the folder part).
  const v = await tracked("models", client.open(key, files, { onEvent: events("models") }));
  loaded.set(key, v);
  manifest.models[key] = { kind: v.kind, title: `${title} (from disk)`, bytes: v.bytes, files: [] };
  showModels();
  showChatModels();
  showLanguageChoice();
  if (v.kind === "llm") $("chat-model").value = key;
  setStatus(`${title} loaded on ${deviceName(v.device)} in ${v.load_s.toFixed(1)} s.`);
  return v;
}

$("open-model").onchange = guarded(async (ev) => {
  const files = [...ev.target.files];
  ev.target.value = "";
  await openFromDisk(files, files.map((f) => f.name).join(", "));
}, "models");
$("open-folder").onchange = guarded(async (ev) => {
  const files = [...ev.target.files];
  ev.target.value = "";
  const folder = files.length && files[0].webkitRelativePath ? files[0].webkitRelativePath.split("/")[0] : "folder";
  await openFromDisk(files.filter((f) => !f.name.startsWith(".")), folder);
}, "models");

// For tests and the console: window.tallowDemo.request("cache-list").
window.tallowDemo = { client, request, ready, ensureModel, loaded, refreshCache, openFromDisk,
                      transcriptAs: (fmt) => transcriptAs(lastTranscript, fmt) };
