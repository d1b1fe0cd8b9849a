// The demo's module worker: Pyodide + tallow, so the page never blocks.
//
// Page -> worker messages ({type, id, ...}); requests run one at a time in
// order, except "stop", which is handled at once (the chat loop yields to the
// event loop between tokens and checks it).
//   load {model}                     fetch the manifest's files (Cache API) and load the model; the
//                                    weights file stays a Blob read in slices (WebGPU copies tensors from it)
//   open {key, files: [File]}        load a model from files the user picked (a .gguf, or a Hugging
//                                    Face folder's files); weights are read in slices, never whole
//   transcribe {model, audio, samples, timestamps, language, task}
//                                    Float32Array at 16 kHz (samples) or WAV bytes; streams
//                                    "segment" and "window" messages: {stage: "audio" (its duration
//                                    is known), "encoding", "decoding" (tokens so far) or "window"
//                                    (one more 30 s window done, time left), done_s, duration}
//   chat {model, messages, maxTokens, options} streams "prefill" then "token" messages; options:
//                                    {temperature, top_p, seed, stop} (tallow.mjs passes them on)
//   cache-list / cache-delete {model} what the Cache API holds per model; drop a model's files
//   run {code}                       test builds only (site.json lists test_hooks.py): evaluate
//                                    Python; the JSON text of its last expression
// Worker -> page: progress {stage, loaded, total, file?}, ready {info, manifest, site},
//   queued {id, ahead}, started {id}, segment, window, prefill, token,
//   result {id, value}, error {id, message, traceback, error_type} (error_type: the Python
//   exception's class name, e.g. ContextWindowError, or null). Every reply to a request carries its
//   id, so several requests can be in flight (tallow.mjs routes each stream's tokens by it).
import { loadPyodide } from "./pyodide/pyodide.mjs";

const CACHE_NAME = "tallow-models-v1";
const params = new URL(self.location.href).searchParams;
// ?device=wgpu|wasm|cpu|python overrides the automatic device choice (worker.py's boot).
// Weights files are read in slices of this size (?slice_mb=, default 64 MiB), so no file is ever
// one ArrayBuffer (the browser refuses those over 2 GB); ?max_binding_mb= lowers the GPU binding
// size tallow assumes (tests use both to exercise slicing and splitting with small files).
const SLICE_BYTES = Math.max(4, Math.round(Number(params.get("slice_mb") || 64) * 2 ** 20));
const MAX_BINDING_MB = params.get("max_binding_mb");
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
    const wantGpu = !params.has("cpu");
    progress("Checking for WebGPU", 0, 0, { boot: true });
    // (a JS null would reach Python as JsNull, not None: pass Python's default instead)
    const info = JSON.parse(await api.boot(wantGpu, MAX_BINDING_MB === null ? undefined : Number(MAX_BINDING_MB),
      params.get("device") || "auto"));
    if (info.measure_speed) {  // the CPU, or WebGPU emulated on it: the page estimates from it what will be slow
      progress("Measuring this CPU", 0, 0, { boot: true });
      try {  // an estimate is a courtesy: a failed probe is said, never a failed boot
        info.cpu_speed = JSON.parse(await api.cpu_speed.callPromising());  // (a WebGPU readback waits on a Promise)
      } catch (e) {
        info.cpu_speed_error = String(e && e.message || e).split("\n").filter(Boolean).pop();
      }
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

// ---- model files, read in slices ------------------------------------------------
// A weights file as a Blob (a picked File, or a Cache API response's blob: both stay on disk)
// read slice by slice: Python reads the header through read(); WebGPU copies each tensor to its
// GPU buffer piece by piece (tallow_wgpu's driver.js writeFromSlices). Slices start at multiples
// of sliceBytes and the last two read are kept, so tensors stored one after another (as files
// store them) cost one Blob read per slice, not one per tensor.
class SlicedFile {
  constructor(blob, sliceBytes = SLICE_BYTES) {
    this.blob = blob;
    this.size = blob.size;
    this.sliceBytes = sliceBytes;
    this.kept = new Map(); // slice index -> Promise of its bytes, oldest first
    this.slices = 0; // Blob slices read, and the largest: what the tests check
    this.largestSlice = 0;
  }

  slice(i) {
    let bytes = this.kept.get(i);
    if (bytes) {
      this.kept.delete(i); // most recently used last
    } else {
      const start = i * this.sliceBytes;
      const n = Math.min(this.sliceBytes, this.size - start);
      this.slices += 1;
      this.largestSlice = Math.max(this.largestSlice, n);
      bytes = this.blob.slice(start, start + n).arrayBuffer().then((b) => new Uint8Array(b));
      if (this.kept.size >= 2) this.kept.delete(this.kept.keys().next().value);
    }
    this.kept.set(i, bytes);
    return bytes;
  }

  // Bytes [offset, offset + size) as a Uint8Array: a view of one slice, or (across slices) a copy.
  async read(offset, size) {
    if (offset < 0 || size < 0 || offset + size > this.size) throw new Error(`read [${offset}, ${offset + size}) outside a ${this.size}-byte file`);
    const step = this.sliceBytes;
    const first = Math.floor(offset / step);
    const last = Math.floor((offset + Math.max(size, 1) - 1) / step);
    if (first === last) {
      const bytes = await this.slice(first);
      return bytes.subarray(offset - first * step, offset - first * step + size);
    }
    const out = new Uint8Array(size);
    for (let i = first; i <= last; i++) {
      const bytes = await this.slice(i);
      const lo = Math.max(offset, i * step);
      const hi = Math.min(offset + size, i * step + bytes.length);
      out.set(bytes.subarray(lo - i * step, hi - i * step), lo - offset);
    }
    return out;
  }
}

// One piece of a model file (the whole file, or one of the parts a build split it into so every
// file of the site is under the static host's limit) as a Blob: from the Cache API when it is
// there, else downloaded into the cache as a stream (with progress), never held whole in memory.
async function cachedPiece(cache, piece, report) {
  const hit = await cache.match(piece.url);
  if (hit) {
    const blob = await hit.blob();
    report(blob.size, true);
    return { blob, hit: true };
  }
  const response = await fetch(piece.url);
  if (!response.ok) throw new Error(`${piece.url}: HTTP ${response.status}`);
  let loaded = 0;
  const counted = response.body.pipeThrough(new TransformStream({
    transform(chunk, controller) {
      loaded += chunk.length;
      report(loaded, false);
      controller.enqueue(chunk);
    },
  }));
  await cache.put(piece.url, new Response(counted, { headers: { "Content-Type": "application/octet-stream" } }));
  const stored = await cache.match(piece.url);
  if (!stored) throw new Error(`${piece.url}: the browser did not keep it in the Cache API (storage full?)`);
  return { blob: await stored.blob(), hit: false };
}

// A model file as one Blob over its pieces (Blobs reference the cached bytes: joining the parts
// copies nothing); the worker reads it in slices.
async function cachedFile(file, report) {
  const cache = await caches.open(CACHE_NAME);
  const pieces = file.parts || [{ url: file.url, size: file.size }];
  const blobs = [];
  let at = 0;
  let fromCache = 0;
  for (const piece of pieces) {
    const { blob, hit } = await cachedPiece(cache, piece, (n, cached) => report(at + n, cached));
    if (blob.size !== piece.size) throw new Error(`${piece.url}: got ${blob.size} bytes, the manifest says ${piece.size}: rebuild the site`);
    if (hit) fromCache += blob.size;
    blobs.push(blob);
    at += blob.size;
  }
  if (at !== file.size) throw new Error(`${file.url}: ${at} of ${file.size} bytes`);
  const blob = blobs.length === 1 ? blobs[0] : new Blob(blobs);
  return { blob, cached: fromCache === file.size, fromCache };
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

// Weights files stay Blobs read in slices (Python reads their header; WebGPU takes each tensor
// from them); the small files (config, tokenizer, mel filters) go to Python's file system.
const isWeights = (name) => /\.(gguf|safetensors)$/i.test(name);
const heapBytes = () => py._module.HEAP8.length;
const sliceStats = (files) => ({
  slices: files.reduce((s, f) => s + f.slices, 0),
  largest_slice: Math.max(0, ...files.map((f) => f.largestSlice)),
  slice_bytes: SLICE_BYTES,
});

async function loadFromManifest(msg) {
  const entry = manifest.models[msg.model];
  if (!entry) throw new Error(`unknown model ${msg.model}`);
  if (entry.missing) throw new Error(`${msg.model} is not available on this site: ${entry.missing}`);
  const tooLarge = api.load_refusal(entry.title || msg.model, entry.bytes || 0, msg.device || "auto");
  if (tooLarge) throw new Error(tooLarge); // before any download
  const started = performance.now();
  const total = entry.bytes;
  let done = 0;
  let fromCache = 0;
  let weights = null;
  const dir = `/models/${msg.model}`;
  py.FS.mkdirTree(dir);
  for (const f of entry.files) {
    const { blob, fromCache: hit } = await cachedFile(f, (n, cached) => progress(
      cached ? `Reading ${f.name} from browser storage` : `Downloading ${f.name}`, done + n, total,
      { model: msg.model, file: { name: f.name, loaded: n, total: f.size, parts: (f.parts || []).length } }));
    fromCache += hit;
    done += blob.size;
    if (isWeights(f.name)) weights = { name: f.name, file: new SlicedFile(blob) };
    else py.FS.writeFile(`${dir}/${f.name}`, new Uint8Array(await blob.arrayBuffer()));
  }
  const what = entry.kind === "whisper" ? "the speech model" : entry.kind === "llm" ? "the chat model" : entry.title;
  progress(`Loading ${what}`, 0, 0, { model: msg.model });
  const info = JSON.parse(await api.load_model_from_js.callPromising(msg.model, dir, weights.name, weights.file, msg.device || "auto"));
  return { ...info, ...sliceStats([weights.file]), bytes: total, from_cache: fromCache,
           load_s: (performance.now() - started) / 1000, heap_bytes: heapBytes() };
}

// Files picked from disk (File objects, posted without copying): a .gguf, or a Hugging Face folder
// (config.json, tokenizer files, *.safetensors, possibly sharded with an index). Small files go to
// Python's file system; weights are read in slices and go JS -> GPU.
async function openLocal(msg) {
  const started = performance.now();
  const dir = `/models/local/${msg.key}`;
  py.FS.mkdirTree(dir);
  const files = msg.files.map((f) => ({ name: f.name.split("/").pop(), blob: f instanceof Blob ? f : new Blob([f.data]) }));
  const bytes = files.reduce((s, f) => s + f.blob.size, 0);
  const gguf = files.find((f) => f.name.toLowerCase().endsWith(".gguf"));
  const tooLarge = api.load_refusal(gguf ? gguf.name : msg.key, bytes, msg.device || "auto");
  if (tooLarge) throw new Error(tooLarge);
  let info;
  let sliced;
  if (gguf) {
    sliced = [new SlicedFile(gguf.blob)];
    info = await api.load_model_from_js.callPromising(msg.key, dir, gguf.name, sliced[0], msg.device || "auto");
  } else {
    const weights = {};
    for (const f of files) {
      if (isWeights(f.name)) weights[f.name] = new SlicedFile(f.blob);
      else py.FS.writeFile(`${dir}/${f.name}`, new Uint8Array(await f.blob.arrayBuffer()));
    }
    sliced = Object.values(weights);
    info = await api.load_folder_from_js.callPromising(msg.key, dir, Object.keys(weights), sliced, msg.device || "auto");
  }
  return { ...JSON.parse(info), ...sliceStats(sliced), bytes, load_s: (performance.now() - started) / 1000,
           heap_bytes: heapBytes() };
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
        return JSON.parse(await api.chat(msg.model, JSON.stringify(msg.messages), msg.maxTokens || 128, onToken, isStopped, onPrefill,
          msg.options ? JSON.stringify(msg.options) : null));
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
  const name = /^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))\b/.exec(lines[at]);
  return { message: lines.slice(at).join("\n").slice(0, 600), traceback: text,
           error_type: name ? name[1].split(".").pop() : null };
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
