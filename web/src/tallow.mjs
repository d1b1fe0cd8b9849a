// tallow in a web page, behind OpenAI's API shape (as web-llm offers it): one ES module that starts
// the site's worker (Pyodide + tallow, off the main thread) and answers
//
//   const client = await createClient();                       // from the built site: ./tallow.mjs
//   const r = await client.chat.completions.create({messages, max_tokens: 64, temperature: 0});
//   for await (const chunk of await client.chat.completions.create({messages, stream: true})) ...
//   const {text} = await client.audio.transcriptions.create({file});   // a File, Blob or ArrayBuffer
//   const {data} = await client.models.list();
//
// The worker and the site's files are found next to this module (import.meta.url), so any page on
// the same origin can import it. Requests run one at a time in the worker, in order; each reply
// carries its request's id, so several may be in flight and a stream gets only its own tokens.
// Errors reject with an APIError carrying OpenAI's status, code and type.
import { prepareFile } from "./audio.js";
import { transcriptAs } from "./transcript.js";

// Worker options (its URL's query): cpu (no WebGPU), device (wgpu, wasm, cpu or python: overrides
// the automatic choice), threads (the wasm device's, where cross-origin isolated), slice_mb, max_binding_mb.
const WORKER_OPTIONS = ["cpu", "device", "threads", "slice_mb", "max_binding_mb"];
const FORMATS = ["json", "text", "verbose_json", "srt", "vtt"];

export class APIError extends Error {
  constructor(message, { status = 500, code = null, type = "server_error", param = null, traceback = null } = {}) {
    super(message);
    this.name = "APIError";
    Object.assign(this, { status, code, type, param, traceback });
  }
}

const badRequest = (message, param = null, code = null) =>
  new APIError(message, { status: 400, type: "invalid_request_error", param, code });

// A worker error as OpenAI would answer it: a context overflow and tallow's own errors (bad input)
// are 400s; anything else is a 500 naming what failed.
function workerError(msg) {
  const options = { traceback: msg.traceback || null };
  if (msg.error_type === "ContextWindowError") {
    return new APIError(msg.message, { ...options, status: 400, type: "invalid_request_error", param: "messages",
                                       code: "context_length_exceeded" });
  }
  if (/^tallow\.errors\.\w+:/.test(msg.message)) {
    return new APIError(msg.message, { ...options, status: 400, type: "invalid_request_error" });
  }
  return new APIError(msg.message, options);
}

// Chunks pushed by the worker's messages, read with for await; breaking out of the loop (or the
// request's AbortSignal) stops the generation between tokens.
class ChunkStream {
  constructor(onStop) {
    this.items = [];
    this.waiters = [];
    this.finished = false;
    this.error = null;
    this.onStop = onStop;
    this.controller = { abort: () => this.return() };
  }

  push(item) {
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve({ value: item, done: false });
    else this.items.push(item);
  }

  end(error = null) {
    if (this.finished) return;
    this.finished = true;
    this.error = error;
    for (const w of this.waiters.splice(0)) error ? w.reject(error) : w.resolve({ value: undefined, done: true });
  }

  next() {
    if (this.items.length) return Promise.resolve({ value: this.items.shift(), done: false });
    if (this.error) {
      const error = this.error;
      this.error = null; // thrown once; then the stream is done
      return Promise.reject(error);
    }
    if (this.finished) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  return() {
    if (!this.finished) this.onStop();
    this.items = [];
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

const now = () => Math.floor(Date.now() / 1000);
const finishReason = (r) => (r.stopped ? "abort" : r.finish_reason === "context" ? "length" : r.finish_reason);
const usageOf = (r) => ({ prompt_tokens: r.prompt_tokens, completion_tokens: r.token_ids.length,
                          total_tokens: r.prompt_tokens + r.token_ids.length });

export class TallowClient {
  // base: the folder of the built site (default: this module's); device: "auto", "cpu" (no
  // WebGPU), or "wgpu" / "wasm" / "python" (the worker says in ready.info.device_note when it could
  // not run there and chose itself); workerOptions: {slice_mb, max_binding_mb}; onProgress(msg): boot
  // and model-load progress ({stage, loaded, total, boot?, model?, file?}).
  constructor({ base = null, device = "auto", workerOptions = {}, onProgress = null } = {}) {
    const url = new URL("worker.mjs", base ? new URL(base, location.href) : new URL("./", import.meta.url));
    const named = device !== "auto" && device !== "cpu" ? { device } : {};
    for (const [name, value] of Object.entries({ ...workerOptions, ...named, cpu: device === "cpu" || workerOptions.cpu })) {
      if (!WORKER_OPTIONS.includes(name)) throw new Error(`unknown worker option ${name} (${WORKER_OPTIONS.join(", ")})`);
      if (value !== undefined && value !== null && value !== false) url.searchParams.set(name, value === true ? "1" : String(value));
    }
    this.worker = new Worker(url, { type: "module" });
    this.onProgress = onProgress;
    this.nextId = 1;
    this.pending = new Map(); // request id -> {resolve, reject, onEvent}
    this.loads = new Map(); // model key -> Promise of its load info
    this.loaded = new Map(); // model key -> load info
    this.manifest = { models: {} };
    this.site = {};
    this.info = null;
    this.ready = new Promise((resolve, reject) => (this._ready = { resolve, reject }));
    this.ready.catch(() => {}); // a failed start also rejects every request: no unhandled rejection
    this.worker.onmessage = (ev) => this._message(ev.data);
    this.chat = { completions: { create: (body, options) => this._chat(body, options) } };
    this.audio = { transcriptions: { create: (body, options) => this._transcribe(body, options, "transcribe") },
                   translations: { create: (body, options) => this._transcribe(body, options, "translate") } };
    this.models = { list: () => this._models() };
  }

  _message(msg) {
    if (msg.type === "progress") {
      if (this.onProgress) this.onProgress(msg);
    } else if (msg.type === "ready") {
      Object.assign(this, { info: msg.info, manifest: msg.manifest, site: msg.site });
      this._ready.resolve(msg.info);
    } else if (msg.type === "fatal") {
      this._ready.reject(new APIError(msg.message, { traceback: msg.traceback, code: "worker_failed" }));
    } else {
      const p = this.pending.get(msg.id);
      if (!p) return;
      if (msg.type === "result") {
        this.pending.delete(msg.id);
        p.resolve(msg.value);
      } else if (msg.type === "error") {
        this.pending.delete(msg.id);
        p.reject(workerError(msg));
      } else if (p.onEvent) {
        p.onEvent(msg); // queued, started, prefill, token, segment, window
      }
    }
  }

  // One worker request (see worker.mjs): a Promise of its result, with the request's id as `.id`.
  request(type, fields = {}, { onEvent = null, transfer = [] } = {}) {
    const id = this.nextId++;
    const p = new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onEvent });
      this.worker.postMessage({ type, id, ...fields }, transfer);
    });
    p.id = id;
    return p;
  }

  stop(id) {
    this.worker.postMessage({ type: "stop", id });
  }

  close() {
    this.worker.terminate();
  }

  // Load a model of the site's manifest once (later calls share the first load).
  load(model, { onEvent = null } = {}) {
    if (!this.loads.has(model)) {
      const p = this.request("load", { model }, { onEvent }).then((v) => (this.loaded.set(model, v), v));
      p.catch(() => this.loads.delete(model));
      this.loads.set(model, p);
    }
    return this.loads.get(model);
  }

  // Files picked from disk (a .gguf, or a Hugging Face folder's files) as model `key`.
  async open(key, files, { onEvent = null } = {}) {
    const v = await this.request("open", { key, files }, { onEvent });
    this.loaded.set(key, v);
    this.manifest.models[key] = { kind: v.kind, title: key, bytes: v.bytes, files: [], local: true };
    return v;
  }

  // The model a request names, else the site's first of that kind; loaded before it runs.
  async _model(name, kind) {
    await this.ready;
    const usable = Object.entries(this.manifest.models).filter(([, m]) => m.kind === kind && !m.missing).map(([k]) => k);
    const key = name ?? usable[0];
    if (!key || !usable.includes(key)) {
      const what = kind === "llm" ? "chat model" : "speech model";
      const known = this.manifest.models[key] && this.manifest.models[key].missing;
      throw new APIError(`The model '${key}' ${known ? `is not available on this site (${known})` :
        `does not exist as a ${what} on this site`} (${what}s here: ${usable.join(", ") || "none"})`,
      { status: 404, type: "invalid_request_error", param: "model", code: "model_not_found" });
    }
    if (!this.loaded.has(key)) await this.load(key);
    return key;
  }

  async _models() {
    await this.ready;
    const data = Object.entries(this.manifest.models).filter(([, m]) => !m.missing).map(([id, m]) => ({
      id, object: "model", created: 0, owned_by: "tallow", kind: m.kind, title: m.title, bytes: m.bytes,
      loaded: this.loaded.has(id) }));
    return { object: "list", data };
  }

  // body: OpenAI's {model, messages, stream, max_tokens (or max_completion_tokens), temperature (default
  // 1, as OpenAI's), top_p, seed, stop}; options: {signal (AbortSignal: stops between tokens), onEvent
  // (the worker's prefill/token messages, with timings)}. The response (or a stream's last chunk)
  // holds the worker's own result as `tallow` (token ids, tokens/s).
  async _chat(body = {}, { signal = null, onEvent = null } = {}) {
    const { messages, stream = false, temperature = 1, top_p = 1, seed = null, stop = null, n = 1 } = body;
    const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? 256;
    if (!Array.isArray(messages) || !messages.length) throw badRequest("'messages' must be a non-empty array", "messages");
    if (n !== 1) throw badRequest("only n=1 is supported", "n");
    if (!Number.isInteger(maxTokens) || maxTokens < 1) throw badRequest("'max_tokens' must be a positive integer", "max_tokens");
    if (typeof temperature !== "number" || temperature < 0 || temperature > 2) throw badRequest("'temperature' must be in [0, 2]", "temperature");
    if (typeof top_p !== "number" || !(top_p > 0 && top_p <= 1)) throw badRequest("'top_p' must be in (0, 1]", "top_p");
    const model = await this._model(body.model, "llm");
    const options = { temperature, top_p, ...(seed === null ? {} : { seed }), ...(stop === null ? {} : { stop }) };
    const id = `chatcmpl-${crypto.randomUUID()}`;
    const created = now();
    const chunk = (delta, finish = null, extra = {}) => ({ id, object: "chat.completion.chunk", created, model,
      choices: [{ index: 0, delta, finish_reason: finish }], ...extra });
    let out = null;
    let accepted;
    const prompted = new Promise((resolve) => (accepted = resolve)); // the prompt fits: the stream starts
    const events = (msg) => {
      if (msg.type === "prefill") accepted();
      if (msg.type === "token" && out) out.push(chunk({ content: msg.text }));
      if (onEvent) onEvent(msg);
    };
    const request = this.request("chat", { model, messages, maxTokens, options }, { onEvent: events });
    const stopNow = () => this.stop(request.id);
    if (signal) {
      if (signal.aborted) stopNow();
      else signal.addEventListener("abort", stopNow, { once: true });
    }
    if (!stream) {
      const r = await request;
      return { id, object: "chat.completion", created, model,
               choices: [{ index: 0, message: { role: "assistant", content: r.text }, finish_reason: finishReason(r) }],
               usage: usageOf(r), tallow: r };
    }
    out = new ChunkStream(stopNow);
    out.push(chunk({ role: "assistant", content: "" }));
    request.then((r) => {
      out.push(chunk({}, finishReason(r), { usage: usageOf(r), tallow: r }));
      out.end();
    }, (err) => out.end(err));
    await Promise.race([prompted, request]); // a refused prompt rejects here, not in the loop
    return out;
  }

  // body: OpenAI's {file (File, Blob, ArrayBuffer or typed array; WAV or any format the browser
  // decodes; a Float32Array is taken as 16 kHz mono samples), model, response_format (json, text,
  // verbose_json, srt, vtt), language}; options: {onEvent (segment and window progress), timestamps
  // (default: with verbose_json, srt and vtt)}. json/verbose_json responses hold the worker's result
  // as `tallow` (seconds, real-time factor, no_speech).
  async _transcribe(body = {}, { onEvent = null, timestamps = null } = {}, task = "transcribe") {
    const { file, response_format = "json", language = null, prompt = null, temperature = 0 } = body;
    if (!FORMATS.includes(response_format)) throw badRequest(`'response_format' must be one of ${FORMATS.join(", ")}`, "response_format");
    if (prompt) throw badRequest("'prompt' is not supported in the page", "prompt", "unsupported_parameter");
    if (temperature) throw badRequest("only temperature 0 is supported in the page (it falls back to higher ones itself)", "temperature", "unsupported_parameter");
    const fields = await audioFields(file);
    const model = await this._model(body.model, "whisper");
    const withTimes = timestamps ?? ["verbose_json", "srt", "vtt"].includes(response_format);
    const r = await this.request("transcribe", { model, ...fields, timestamps: withTimes, language, task },
      { onEvent, transfer: [fields.audio.buffer] });
    if (response_format === "text") return r.text;
    if (response_format === "srt" || response_format === "vtt") return transcriptAs(r, response_format);
    if (response_format === "json") return { text: r.text, tallow: r };
    return { task, language: r.language, duration: r.duration, text: r.text,
             segments: r.segments.map((s, i) => ({ id: i, start: s.start, end: s.end, text: s.text, no_speech_prob: s.no_speech_prob })),
             tallow: r };
  }
}

// The worker's transcribe fields for a file: WAV bytes as they are (tallow reads them), other
// formats decoded by the browser to 16 kHz samples.
async function audioFields(file) {
  if (file instanceof Float32Array) return { audio: file, samples: true };
  let bytes;
  if (file instanceof Blob) bytes = await file.arrayBuffer();
  else if (file instanceof ArrayBuffer) bytes = file.slice(0);
  else if (ArrayBuffer.isView(file)) bytes = file.buffer.slice(file.byteOffset, file.byteOffset + file.byteLength);
  else throw badRequest("'file' must be a File, Blob, ArrayBuffer or typed array", "file");
  try {
    return await prepareFile(file.name || "the file", bytes);
  } catch (err) {
    throw badRequest(err.message, "file");
  }
}

// A client whose worker has started (Python and tallow loaded, the device chosen).
export async function createClient(options = {}) {
  const client = new TallowClient(options);
  await client.ready;
  return client;
}
