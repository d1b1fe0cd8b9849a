// The demo's module worker: Pyodide + tallow, so the page never blocks.
//
// Page -> worker messages ({type, id, ...}); requests run one at a time in
// order, except "stop", which is handled at once (the chat loop yields to the
// event loop between tokens and checks it).
//   load {model}                     fetch the manifest's files (Cache API) and load the model; the
//                                    weights file stays a JS buffer (WebGPU copies tensors from it)
//   open {key, files: [{name, data}]} load a model from files the user picked
//   transcribe {model, audio, samples, timestamps, language, task}
//                                    Float32Array at 16 kHz (samples) or WAV bytes; streams
//                                    "segment" and "window" (progress, time left) messages
//   chat {model, messages, maxTokens} streams "prefill" then "token" messages
//   cache-list / cache-delete {model} what the Cache API holds per model; drop a model's files
//   run {code}                       test builds only (site.json lists test_hooks.py): evaluate
//                                    Python; the JSON text of its last expression
// Worker -> page: progress {stage, loaded, total, file?}, ready {info, manifest, site},
//   queued {id, ahead}, started {id}, segment, window, prefill, token,
//   result {id, value}, error {id, message, traceback}.
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

// fetch that reports the bytes of every response body as they arrive: Pyodide fetches its own
// runtime files, so wrapping fetch during boot is how the page learns their download progress.
function countingFetch(realFetch, onBytes) {
  return async (input, init) => {
    const r = await realFetch(input, init);
    if (!r.body || r.status !== 200) return r;
    const counter = new TransformStream({
      transform(chunk, ctl) {
        onBytes(chunk.length);
        ctl.enqueue(chunk);
      },
    });
    return new Response(r.body.pipeThrough(counter), { status: r.status, statusText: r.statusText, headers: r.headers });
  };
}

let site = { python: ["worker.py"], runtime_bytes: 0 };
let testHooks = null;

async function boot() {
  const t0 = performance.now();
  site = await (await fetch("site.json")).json();
  let runtimeLoaded = 0;
  let stage = "Downloading the Python runtime (Pyodide)";
  const realFetch = self.fetch;
  self.fetch = countingFetch(realFetch.bind(self), (n) => {
    runtimeLoaded += n;
    progress(stage, Math.min(runtimeLoaded, site.runtime_bytes), site.runtime_bytes, { boot: true });
  });
  try {
    progress(stage, 0, site.runtime_bytes, { boot: true });
    py = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
    const bootS = (performance.now() - t0) / 1000;
    stage = "Installing tallow";
    progress(stage, runtimeLoaded, site.runtime_bytes, { boot: true });
    const pySite = py.runPython("import site; site.getsitepackages()[0]");
    const index = await (await fetch("wheels/index.json")).json();
    for (const name of index.archives) {
      py.unpackArchive(await fetchBytes(`wheels/${name}`), name.endsWith(".whl") ? "wheel" : "zip", { extractDir: pySite });
    }
    for (const name of site.python) {  // worker.py is imported as tallow_web_worker
      const module = name === "worker.py" ? "tallow_web_worker.py" : `tallow_web_${name}`;
      py.FS.writeFile(`${pySite}/${module}`, await fetchBytes(name));
    }
    self.fetch = realFetch;
    py.runPython("import importlib; importlib.invalidate_caches()");
    api = py.pyimport("tallow_web_worker");
    if (site.python.includes("test_hooks.py")) testHooks = py.pyimport("tallow_web_test_hooks");
    manifest = await (await fetch("models/manifest.json")).json();
    const wantGpu = !new URL(self.location.href).searchParams.has("cpu");
    progress("Probing WebGPU", 0, 0, { boot: true });
    const info = JSON.parse(await api.boot(wantGpu));
    if (info.device !== "wgpu") {
      progress("Measuring this CPU", 0, 0, { boot: true });
      info.cpu_speed = JSON.parse(api.cpu_speed());  // the page estimates from it what will be slow
    }
    info.boot_s = bootS;
    info.ready_s = (performance.now() - t0) / 1000;
    info.runtime_bytes = runtimeLoaded;
    info.pyodide = py.version;
    post({ type: "ready", info, manifest, site });
  } finally {
    self.fetch = realFetch;
  }
}

// Read a response body into `into` at `at`, reporting bytes as they arrive; returns the byte count.
async function readInto(response, into, at, report) {
  const reader = response.body.getReader();
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (at + n + value.length > into.length) throw new Error(`${response.url}: more bytes than the manifest says`);
    into.set(value, at + n);
    n += value.length;
    report(n);
  }
  return n;
}

// A model file: each of its pieces (the whole file, or the parts a build split it into so every
// file of the site is under the static host's limit) from the Cache API when it is there, else
// downloaded (with progress) and cached. The pieces are written into one buffer of the file's
// size, allocated once: no list of chunks and no joined copy.
async function cachedFile(file, report) {
  const cache = await caches.open(CACHE_NAME);
  const pieces = file.parts || [{ url: file.url, size: file.size }];
  const bytes = new Uint8Array(file.size);
  let at = 0;
  let fromCache = 0;
  for (const piece of pieces) {
    const hit = await cache.match(piece.url);
    const response = hit || (await fetch(piece.url));
    if (!response.ok) throw new Error(`${piece.url}: HTTP ${response.status}`);
    const n = await readInto(response, bytes, at, (k) => report(at + k, !!hit));
    if (n !== piece.size) throw new Error(`${piece.url}: got ${n} bytes, the manifest says ${piece.size}: rebuild the site`);
    if (hit) fromCache += n;
    else await cache.put(piece.url, new Response(bytes.subarray(at, at + n), { headers: { "Content-Type": "application/octet-stream" } }));
    at += n;
  }
  if (at !== file.size) throw new Error(`${file.url}: ${at} of ${file.size} bytes`);
  return { bytes, cached: fromCache === file.size, fromCache };
}

// The cached bytes of each manifest model: {key: {bytes, files, of}} (of: the model's file count).
async function cacheList() {
  const cache = await caches.open(CACHE_NAME);
  const urls = new Set((await cache.keys()).map((r) => new URL(r.url).pathname + new URL(r.url).search));
  const out = {};
  for (const [key, entry] of Object.entries(manifest.models)) {
    let bytes = 0;
    let files = 0;
    for (const f of entry.files) {
      const pieces = f.parts || [{ url: f.url, size: f.size }];
      const have = pieces.filter((p) => urls.has(new URL(p.url, self.location.href).pathname + new URL(p.url, self.location.href).search));
      bytes += have.reduce((s, p) => s + p.size, 0);
      if (have.length === pieces.length) files += 1;
    }
    out[key] = { bytes, files, of: entry.files.length };
  }
  const estimate = navigator.storage && navigator.storage.estimate ? await navigator.storage.estimate() : {};
  return { models: out, usage: estimate.usage ?? null, quota: estimate.quota ?? null };
}

// Drop every cached file of a model (all versions: any URL under models/KEY/).
async function cacheDelete(key) {
  if (!manifest.models[key]) throw new Error(`unknown model ${key}`);
  const cache = await caches.open(CACHE_NAME);
  const prefix = new URL(`models/${key}/`, self.location.href).pathname;
  let deleted = 0;
  for (const request of await cache.keys()) {
    if (new URL(request.url).pathname.startsWith(prefix)) deleted += (await cache.delete(request)) ? 1 : 0;
  }
  return { deleted };
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
    const { bytes, fromCache: hit } = await cachedFile(f, (n, cached) => progress(
      cached ? `Reading ${f.name} from browser storage` : `Downloading ${f.name}`, done + n, total,
      { model: msg.model, file: { name: f.name, loaded: n, total: f.size, parts: (f.parts || []).length } }));
    fromCache += hit;
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
      const onWindow = (json) => post({ type: "window", id: msg.id, ...JSON.parse(json) });
      return JSON.parse(await api.transcribe.callPromising(msg.model, msg.audio, !!msg.samples, onSegment,
        msg.timestamps !== false, onWindow, msg.language || null, msg.task || "transcribe"));
    }
    case "chat": {
      const onToken = (text, json) => post({ type: "token", id: msg.id, text, ...JSON.parse(json) });
      const onPrefill = (json) => post({ type: "prefill", id: msg.id, ...JSON.parse(json) });
      const isStopped = () => stopped.has(msg.id);
      try {
        return JSON.parse(await api.chat(msg.model, JSON.stringify(msg.messages), msg.maxTokens || 128, onToken, isStopped, onPrefill));
      } finally {
        stopped.delete(msg.id);
      }
    }
    case "run":
      if (!testHooks) throw new Error("this site has no `run` request (only test builds do: build(..., test_hooks=True))");
      // JSON text: Python's json writes NaN/Infinity, which JSON.parse refuses; the caller parses it.
      return await testHooks.run_code(msg.code);
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

let waiting = 0; // requests accepted and not finished (the one running included)
let started = false; // Python is up

// Requests that need no Python (the Cache API): answered at once, even while a model runs.
async function handleNow(msg) {
  try {
    const value = msg.type === "cache-list" ? await cacheList() : await cacheDelete(msg.model);
    post({ type: "result", id: msg.id, op: msg.type, value });
  } catch (err) {
    post({ type: "error", id: msg.id, op: msg.type, ...errorMessage(err) });
  }
}
booted.then(() => (started = true), () => {});

self.onmessage = (ev) => {
  const msg = ev.data;
  if (msg.type === "stop") {
    stopped.add(msg.id);
    return;
  }
  if (msg.type === "cache-list" || msg.type === "cache-delete") {
    booted.then(() => handleNow(msg), () => handleNow(msg));  // the manifest comes with the boot
    return;
  }
  if (waiting > 0 || !started) post({ type: "queued", id: msg.id, op: msg.type, ahead: waiting, booting: !started });
  waiting += 1;
  queue = queue.then(async () => {
    post({ type: "started", id: msg.id, op: msg.type });
    try {
      const value = await handle(msg);
      post({ type: "result", id: msg.id, op: msg.type, value });
    } catch (err) {
      post({ type: "error", id: msg.id, op: msg.type, ...errorMessage(err) });
    } finally {
      waiting -= 1;
    }
  }, () => {
    waiting -= 1;
    post({ type: "error", id: msg.id, op: msg.type, message: "Python did not start (see the message above)" });
  });
};
