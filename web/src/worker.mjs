// The demo's module worker: Pyodide + tallow, so the page never blocks.
//
// Page -> worker messages ({type, id, ...}); requests run one at a time in
// order, except "stop", which is handled at once (the chat loop yields to the
// event loop between tokens and checks it).
//   load {model}                     fetch the manifest's files (Cache API) and load the model; the
//                                    weights file stays a JS buffer (WebGPU copies tensors from it)
//   open {key, files: [{name, data}]} load a model from files the user picked
//   transcribe {model, audio, samples} Float32Array at 16 kHz (samples) or WAV bytes
//   chat {model, messages, maxTokens} streams "token" messages
//   run {code}                       evaluate Python; the JSON text of its last expression
// Worker -> page: status, progress {stage, loaded, total}, ready {info, manifest},
//   loaded, segment, token, result {id, value}, error {id, message, traceback}.
import { loadPyodide } from "./pyodide/pyodide.mjs";

const CACHE_NAME = "tallow-models-v1";
const post = (msg) => self.postMessage(msg);
const stopped = new Set();
let py = null;
let api = null;
let manifest = { models: {} };

function progress(stage, loaded = 0, total = 0, extra = {}) {
  post({ type: "progress", stage, loaded, total, ...extra });
}

async function fetchBytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

async function boot() {
  const t0 = performance.now();
  progress("Starting Python (Pyodide)");
  py = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
  const bootS = (performance.now() - t0) / 1000;
  progress("Installing tallow");
  const site = py.runPython("import site; site.getsitepackages()[0]");
  const index = await (await fetch("wheels/index.json")).json();
  for (const name of index.archives) {
    py.unpackArchive(await fetchBytes(`wheels/${name}`), name.endsWith(".whl") ? "wheel" : "zip", { extractDir: site });
  }
  py.FS.writeFile(`${site}/tallow_web_worker.py`, await fetchBytes("worker.py"));
  py.runPython("import importlib; importlib.invalidate_caches()");
  api = py.pyimport("tallow_web_worker");
  manifest = await (await fetch("models/manifest.json")).json();
  const wantGpu = !new URL(self.location.href).searchParams.has("cpu");
  progress("Probing WebGPU");
  const info = JSON.parse(await api.boot(wantGpu));
  info.boot_s = bootS;
  info.ready_s = (performance.now() - t0) / 1000;
  info.pyodide = py.version;
  post({ type: "ready", info, manifest });
}

// A model file: from the Cache API when it is there, else downloaded (with progress) and cached.
async function cachedFile(url, size, report) {
  const cache = await caches.open(CACHE_NAME);
  const hit = await cache.match(url);
  if (hit) {
    const bytes = new Uint8Array(await hit.arrayBuffer());
    report(bytes.length, true);
    return { bytes, cached: true };
  }
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const reader = response.body.getReader();
  const chunks = [];
  let loaded = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    loaded += value.length;
    report(loaded, false);
  }
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  await cache.put(url, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }));
  return { bytes, cached: false };
}

// The weights file stays in JS memory (Python reads its header; WebGPU takes each tensor from it);
// the small files (config, tokenizer, mel filters) go to Python's file system.
const isWeights = (name) => /\.(gguf|safetensors)$/i.test(name);
const heapBytes = () => py._module.HEAP8.length;

async function loadFromManifest(msg) {
  const entry = manifest.models[msg.model];
  if (!entry) throw new Error(`unknown model ${msg.model}`);
  if (entry.missing) throw new Error(`${msg.model} is not available on this site: ${entry.missing}`);
  const started = performance.now();
  const total = entry.bytes;
  let done = 0;
  let fromCache = 0;
  let weights = null;
  const dir = `/models/${msg.model}`;
  py.FS.mkdirTree(dir);
  for (const f of entry.files) {
    const { bytes, cached } = await cachedFile(f.url, f.size, (n) => progress(`Downloading ${f.name}`, done + n, total, { model: msg.model }));
    if (cached) fromCache += bytes.length;
    done += bytes.length;
    if (isWeights(f.name)) weights = { name: f.name, bytes };
    else py.FS.writeFile(`${dir}/${f.name}`, bytes);
  }
  progress(`Loading ${msg.model} into tallow`, total, total, { model: msg.model });
  const info = JSON.parse(await api.load_model_from_js.callPromising(msg.model, dir, weights.name, weights.bytes, msg.device || "auto"));
  return { ...info, bytes: total, from_cache: fromCache, load_s: (performance.now() - started) / 1000, heap_bytes: heapBytes() };
}

async function openLocal(msg) {
  const started = performance.now();
  const dir = `/models/local/${msg.key}`;
  py.FS.mkdirTree(dir);
  const gguf = msg.files.find((f) => f.name.toLowerCase().endsWith(".gguf"));
  const bytes = msg.files.reduce((s, f) => s + f.data.byteLength, 0);
  let info;
  if (gguf) {
    info = await api.load_model_from_js.callPromising(msg.key, dir, gguf.name, new Uint8Array(gguf.data), msg.device || "auto");
  } else {  // a Hugging Face folder (possibly sharded): through the file system
    for (const f of msg.files) py.FS.writeFile(`${dir}/${f.name}`, new Uint8Array(f.data));
    info = await api.load_model.callPromising(msg.key, dir, msg.device || "auto");
  }
  return { ...JSON.parse(info), bytes, load_s: (performance.now() - started) / 1000, heap_bytes: heapBytes() };
}

async function handle(msg) {
  switch (msg.type) {
    case "load":
      return await loadFromManifest(msg);
    case "open":
      return await openLocal(msg);
    case "transcribe": {
      const onSegment = (json) => post({ type: "segment", id: msg.id, segment: JSON.parse(json) });
      return JSON.parse(await api.transcribe.callPromising(msg.model, msg.audio, !!msg.samples, onSegment, msg.timestamps !== false));
    }
    case "chat": {
      const onToken = (text) => post({ type: "token", id: msg.id, text });
      const isStopped = () => stopped.has(msg.id);
      try {
        return JSON.parse(await api.chat(msg.model, JSON.stringify(msg.messages), msg.maxTokens || 128, onToken, isStopped));
      } finally {
        stopped.delete(msg.id);
      }
    }
    case "run":
      // JSON text: Python's json writes NaN/Infinity, which JSON.parse refuses; the caller parses it.
      return await api.run_code(msg.code);
    default:
      throw new Error(`unknown request ${JSON.stringify(msg.type)}`);
  }
}

function errorMessage(err) {
  // A Python exception arrives as a PythonError whose message is the whole traceback:
  // the page shows the exception line onwards (first 600 characters), the console gets all of it.
  const text = String((err && err.message) || err).trim();
  const lines = text.split("\n");
  let at = lines.length - 1;
  for (let i = lines.length - 1; i >= 0; i--) {
    if (/^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b/.test(lines[i])) {
      at = i;
      break;
    }
  }
  return { message: lines.slice(at).join("\n").slice(0, 600), traceback: text };
}

const booted = boot().catch((err) => {
  post({ type: "fatal", ...errorMessage(err) });
  throw err;
});
let queue = booted;

self.onmessage = (ev) => {
  const msg = ev.data;
  if (msg.type === "stop") {
    stopped.add(msg.id);
    return;
  }
  queue = queue.then(async () => {
    try {
      const value = await handle(msg);
      post({ type: "result", id: msg.id, op: msg.type, value });
    } catch (err) {
      post({ type: "error", id: msg.id, op: msg.type, ...errorMessage(err) });
    }
  }, () => post({ type: "error", id: msg.id, op: msg.type, message: "Python did not start (see the message above)" }));
};
