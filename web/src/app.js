// The page: talks to worker.mjs by messages and never runs Python itself.
import { prepareFile, startRecording } from "./audio.js";

const $ = (id) => document.getElementById(id);
const workerUrl = new URL("worker.mjs", import.meta.url);
// Options the worker reads: ?cpu, and the big-model knobs ?slice_mb= / ?max_binding_mb= (tests lower them).
for (const [name, value] of new URL(location.href).searchParams) {
  if (["cpu", "slice_mb", "max_binding_mb"].includes(name)) workerUrl.searchParams.set(name, value || "1");
}
const worker = new Worker(workerUrl, { type: "module" });

let nextId = 1;
const pending = new Map(); // id -> {resolve, reject, onEvent}
const loaded = new Map(); // model key -> load info
let manifest = { models: {} };
let info = null;
let resolveReady;
const ready = new Promise((r) => (resolveReady = r));

// request(type, fields, onEvent) -> Promise of the worker's result value.
function request(type, fields = {}, onEvent = null, transfer = []) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject, onEvent });
    worker.postMessage({ type, id, ...fields }, transfer);
  });
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => (box.hidden = true), 15000);
}

function setStatus(text) {
  $("status").textContent = text;
}

function mb(bytes) {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

worker.onmessage = (ev) => {
  const msg = ev.data;
  if (msg.type === "progress") {
    const bar = $("progress");
    setStatus(msg.total ? `${msg.stage}: ${mb(msg.loaded)} of ${mb(msg.total)}` : `${msg.stage}…`);
    bar.hidden = !msg.total;
    if (msg.total) bar.value = msg.loaded / msg.total;
    return;
  }
  if (msg.type === "ready") {
    info = msg.info;
    manifest = msg.manifest;
    showDevice();
    showModels();
    showChatModels();
    setStatus(`Ready in ${info.ready_s.toFixed(1)} s (Pyodide ${info.pyodide}, tallow ${info.tallow}).`);
    document.body.dataset.ready = "1";
    resolveReady(info);
    return;
  }
  if (msg.type === "fatal") {
    setStatus("Python failed to start.");
    showError(msg.message);
    console.warn(msg.traceback);
    return;
  }
  const p = pending.get(msg.id);
  if (!p) return;
  if (msg.type === "result") {
    pending.delete(msg.id);
    p.resolve(msg.value);
  } else if (msg.type === "error") {
    pending.delete(msg.id);
    console.warn(msg.traceback || msg.message);
    p.reject(new Error(msg.message));
  } else if (p.onEvent) {
    p.onEvent(msg);
  }
};

function showDevice() {
  const rows = [["Python", `Pyodide ${info.pyodide}, tallow ${info.tallow}${info.numpy ? ", numpy" : ""}`],
                ["compute", info.device === "wgpu" ? "WebGPU" : `CPU (${info.device === "cpu" ? "numpy" : "pure Python"})`]];
  if (info.gpu) {
    rows.push(["adapter", `${info.gpu.adapter}${info.gpu.vendor ? ` (${info.gpu.vendor})` : ""}${info.gpu.cpu_emulated ? " — emulated on the CPU" : ""}`]);
    rows.push(["f16", info.gpu.f16 ? "yes (shader-f16)" : "no: f16 weights run as f32"]);
  } else {
    rows.push(["WebGPU", `not available, running on the CPU fallback: ${info.gpu_error || "disabled"}`]);
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
}

function showModels() {
  const body = $("models").querySelector("tbody");
  body.innerHTML = "";
  for (const [key, m] of Object.entries(manifest.models)) {
    const tr = document.createElement("tr");
    tr.dataset.model = key;
    const state = loaded.has(key) ? `loaded on ${loaded.get(key).device} in ${loaded.get(key).seconds.toFixed(1)} s` : m.missing || "not loaded";
    tr.innerHTML = `<td></td><td>${m.bytes ? mb(m.bytes) : "—"}</td><td class="state"></td><td></td>`;
    tr.cells[0].textContent = m.title;
    tr.cells[2].textContent = state;
    if (!m.missing && !loaded.has(key)) {
      const b = document.createElement("button");
      b.textContent = "Load";
      b.onclick = () => ensureModel(key).catch((e) => showError(e.message));
      tr.cells[3].append(b);
    }
    body.append(tr);
  }
}

const loading = new Map();
function ensureModel(key) {
  if (!loading.has(key)) {
    const p = request("load", { model: key }).then((v) => {
      loaded.set(key, v);
      showModels();
      showChatModels();
      setStatus(`${key} loaded on ${v.device} in ${v.seconds.toFixed(1)} s${v.from_cache ? " (files from browser storage)" : ""}.`);
      $("progress").hidden = true;
      return v;
    });
    p.catch(() => loading.delete(key));
    loading.set(key, p);
  }
  return loading.get(key);
}

function modelOfKind(kind) {
  for (const key of loaded.keys()) if (loaded.get(key).kind === kind && key.startsWith("local-")) return key;
  return Object.keys(manifest.models).find((k) => manifest.models[k].kind === kind && !manifest.models[k].missing);
}

// ---- speech -------------------------------------------------------------------
async function transcribe(fields, transfer) {
  $("segments").innerHTML = "";
  $("transcript").textContent = "";
  $("speech-stats").textContent = "";
  const key = modelOfKind("whisper");
  if (!key) throw new Error("no speech model on this site: run `tallow fetch whisper-tiny.en` and rebuild");
  if (!loaded.has(key)) await ensureModel(key);
  setStatus("Transcribing…");
  const onEvent = (msg) => {
    if (msg.type !== "segment") return;
    const li = document.createElement("li");
    li.textContent = `[${msg.segment.start.toFixed(2)} → ${msg.segment.end.toFixed(2)}] ${msg.segment.text}`;
    $("segments").append(li);
  };
  const timestamps = $("timestamps").checked;
  const r = await request("transcribe", { model: key, timestamps, ...fields }, onEvent, transfer);
  $("transcript").textContent = r.text;
  $("speech-stats").textContent = `${r.duration.toFixed(1)} s of audio in ${r.seconds.toFixed(1)} s: real-time factor ${r.rtf.toFixed(2)} (on ${loaded.get(key).device})`;
  setStatus("Transcribed.");
  return r;
}

async function transcribeFile(file) {
  const bytes = await file.arrayBuffer();
  const fields = await prepareFile(file.name, bytes);
  return transcribe(fields, [fields.audio.buffer]);
}

function guarded(fn) {
  return (...args) => fn(...args).catch((e) => {
    setStatus("Failed (see the message below).");
    showError(e.message);
  });
}

$("audio-file").onchange = guarded(async (ev) => {
  const file = ev.target.files[0];
  ev.target.value = "";
  if (file) await transcribeFile(file);
});
const drop = $("drop");
drop.ondragover = (ev) => { ev.preventDefault(); drop.classList.add("over"); };
drop.ondragleave = () => drop.classList.remove("over");
drop.ondrop = guarded(async (ev) => {
  ev.preventDefault();
  drop.classList.remove("over");
  const file = ev.dataTransfer.files[0];
  if (file) await transcribeFile(file);
});
let recorder = null;
$("record").onclick = guarded(async () => {
  const button = $("record");
  if (!recorder) {
    recorder = await startRecording();
    button.textContent = "■ Stop and transcribe";
    button.classList.add("recording");
    return;
  }
  const r = recorder;
  recorder = null;
  button.textContent = "● Record";
  button.classList.remove("recording");
  const samples = await r.stop();
  await transcribe({ audio: samples, samples: true }, [samples.buffer]);
});

// ---- chat ---------------------------------------------------------------------
const history = [];
let chatId = null;

$("chat-form").onsubmit = guarded(async (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chatId !== null) return;
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
  try {
    if (!loaded.has(key)) await ensureModel(key);
    $("stop").disabled = false;
    setStatus("Generating…");
    const started = performance.now();
    let n = 0;
    const p = request("chat", { model: key, messages: history, maxTokens: Number($("max-tokens").value) || 64 }, (msg) => {
      if (msg.type !== "token") return;
      n += 1;
      reply.textContent += msg.text;
      $("chat-stats").textContent = `${n} pieces, ${(n / ((performance.now() - started) / 1000)).toFixed(1)} /s`;
    });
    chatId = nextId - 1;
    const r = await p;
    history.push({ role: "assistant", content: r.text });
    reply.dataset.done = "1";
    $("chat-stats").textContent = `${r.token_ids.length} tokens, ${r.tokens_per_s.toFixed(2)} tokens/s after a ${r.prompt_tokens}-token prompt ` +
      `(${r.prefill_tokens_per_s.toFixed(1)} tokens/s), ${r.finish_reason} (on ${loaded.get(key).device})`;
    setStatus(r.stopped ? "Stopped." : "Done.");
  } catch (e) {
    history.pop();
    reply.dataset.done = "error";
    throw e;
  } finally {
    chatId = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
});
$("stop").onclick = () => {
  if (chatId !== null) worker.postMessage({ type: "stop", id: chatId });
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
  const v = await request("open", { key, files });
  loaded.set(key, v);
  manifest.models[key] = { kind: v.kind, title: `${title} (from disk)`, bytes: v.bytes, files: [] };
  showModels();
  showChatModels();
  if (v.kind === "llm") $("chat-model").value = key;
  setStatus(`${title} loaded on ${v.device} in ${v.load_s.toFixed(1)} s.`);
  return v;
}

$("open-model").onchange = guarded(async (ev) => {
  const files = [...ev.target.files];
  ev.target.value = "";
  await openFromDisk(files, files.map((f) => f.name).join(", "));
});
$("open-folder").onchange = guarded(async (ev) => {
  const files = [...ev.target.files];
  ev.target.value = "";
  const folder = files.length && files[0].webkitRelativePath ? files[0].webkitRelativePath.split("/")[0] : "folder";
  await openFromDisk(files.filter((f) => !f.name.startsWith(".")), folder);
});

// For tests and the console: window.tallowDemo.request("run", {code: "1 + 1"}).
window.tallowDemo = { request, ready, ensureModel, loaded, openFromDisk };
