// JS half of tallow.backends.wasm.driver_browser: kernels.wasm instantiated over a
// WebAssembly.Memory this file owns, with a bump allocator (the Python driver keeps the free
// lists), byte reads and writes, export calls, and writes of a Blob's slices (a Cache API entry
// or a picked file, read by worker.mjs's SlicedFile) straight into the memory, never through
// the Python heap.
//
// Threads (docs/wasm.md "Threads"): given kernels_mt.wasm and threads > 1 in a cross-origin
// isolated page, the memory is shared (WebAssembly.Memory({shared: true})) and threads - 1 workers
// (from a Blob URL: this file needs no file of its own) each instantiate kernels_mt.wasm over it with
// a stack of their own. runThreads(table, step) runs one program per thread, thread 0 here: the
// workers sleep on a control word (Atomics.wait) between runs, and the programs' own barriers
// (threads_ir) keep them in step; every program ends at a barrier, so all are done when this returns.
// A trap in any thread sets the barrier's abort word, which stops the others, and the threads are
// then refused (the error says why). Without all that: one thread, the unshared kernels.wasm.
//
// This file is evaluated with `new Function(text)()`: its last statement returns the factory.
const THREAD_WORKER = `
onmessage = (event) => {
  const { module, memory, stackTop, tid, control, barrier } = event.data;
  let ex;
  try {
    ex = new WebAssembly.Instance(module, { env: { memory } }).exports;
    ex.__stack_pointer.value = stackTop;
  } catch (err) {
    postMessage({ error: String(err) });
    return;
  }
  postMessage({ ready: true });
  const ctl = new Int32Array(memory.buffer, control, 8);
  const abort = new Int32Array(memory.buffer, barrier, 3);
  for (let seen = 0; ;) {
    Atomics.wait(ctl, 0, seen);
    seen = Atomics.load(ctl, 0);
    if (Atomics.load(ctl, 1)) return;
    const words = new Int32Array(memory.buffer, Atomics.load(ctl, 2) + 8 * tid, 2);
    try {
      ex.run(words[0], words[1], Atomics.load(ctl, 3));
    } catch (err) {
      Atomics.store(ctl, 4, 1);
      Atomics.store(abort, 2, 1);
      Atomics.notify(abort, 1);
    }
  }
};`;

async function makeTallowWasm(moduleBytes, threadedBytes, threads) {
  const PAGE = 65536;
  const ALIGN = 16; // every range starts on a SIMD128 boundary
  const align = (n) => Math.ceil(n / ALIGN) * ALIGN;
  let want = Math.max(1, Math.floor(Number(threads) || 1));
  let threadsNote = null;
  if (want > 1 && !threadedBytes) threadsNote = "this tallow has no kernels_mt.wasm";
  else if (want > 1 && !self.crossOriginIsolated) threadsNote = "the page is not cross-origin isolated";
  if (threadsNote) want = 1;
  let module, memory;
  if (want > 1) {
    try {
      module = await WebAssembly.compile(threadedBytes);
      memory = new WebAssembly.Memory({ initial: 64, maximum: 65536, shared: true });
    } catch (err) {
      threadsNote = `the threaded module cannot start here (${err})`;
      want = 1;
    }
  }
  if (want === 1) {
    module = await WebAssembly.compile(moduleBytes);
    memory = new WebAssembly.Memory({ initial: 64 }); // the module asks for a few pages (stack, constants)
  }
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  const ex = instance.exports;
  let next = align(ex.__heap_base.value);

  function alloc(nbytes) {
    const at = next;
    next = align(at + nbytes);
    const have = memory.buffer.byteLength;
    if (next > have) {
      if (next > 4 * 2 ** 30) throw new RangeError(`the wasm memory cannot hold ${next} bytes (wasm32: 4 GiB)`);
      memory.grow(Math.ceil((next - have) / PAGE));
    }
    return at;
  }
  const read = (at, nbytes) => new Uint8Array(memory.buffer, at, nbytes).slice();
  const write = (at, bytes) => new Uint8Array(memory.buffer, at, bytes.length).set(bytes);

  function call(name, args) {
    const fn = ex[name];
    if (typeof fn !== "function") throw new Error(`kernels.wasm has no export ${name}`);
    fn(...args);
  }

  async function writeFromSlices(at, file, srcOffset, nbytes) {
    for (let done = 0; done < nbytes;) {
      const n = Math.min(file.sliceBytes, nbytes - done);
      const bytes = await file.read(srcOffset + done, n);
      new Uint8Array(memory.buffer, at + done, n).set(bytes); // (the view after any grow)
      done += n;
    }
  }

  // nbytes of a JS ArrayBuffer or typed array (a fetched weights file) from srcOffset, synchronously.
  function writeFromBuffer(at, buffer, srcOffset, nbytes) {
    const bytes = ArrayBuffer.isView(buffer) ?
      new Uint8Array(buffer.buffer, buffer.byteOffset + srcOffset, nbytes) : new Uint8Array(buffer, srcOffset, nbytes);
    new Uint8Array(memory.buffer, at, nbytes).set(bytes);
  }

  const zero = (at, nbytes) => new Uint8Array(memory.buffer, at, nbytes).fill(0);
  const copy = (dst, src, nbytes) => new Uint8Array(memory.buffer).copyWithin(dst, src, src + nbytes);

  const table = alloc(65536 * 4);
  ex.f16_table(table);

  // ---- threads ----
  let control = 0, barrier = 0, broken = null;
  const workers = [];
  if (want > 1) {
    control = alloc(64); // seq, stop, table, step, failed; the barrier's three words at +32
    barrier = control + 32;
    const url = URL.createObjectURL(new Blob([THREAD_WORKER], { type: "text/javascript" }));
    try {
      const ready = [];
      for (let tid = 1; tid < want; tid++) {
        const stackTop = alloc(65536) + 65536;
        const worker = new Worker(url);
        workers.push(worker);
        ready.push(new Promise((resolve, reject) => {
          worker.onmessage = (e) => (e.data.ready ? resolve() : reject(new Error(e.data.error)));
          worker.onerror = (e) => reject(new Error(e.message || "a thread worker failed to start"));
        }));
        worker.postMessage({ module, memory, stackTop, tid, control, barrier });
      }
      await Promise.all(ready);
    } catch (err) {
      // the memory is shared already: run the threaded module on this thread alone
      for (const w of workers) w.terminate();
      workers.length = 0;
      threadsNote = `thread workers could not start (${err.message})`;
      want = 1;
    } finally {
      URL.revokeObjectURL(url);
    }
  }
  const ctl = () => new Int32Array(memory.buffer, control, 12);

  function runThreads(tableAt, step) {
    if (broken) throw new Error(`the wasm threads stopped after an error: ${broken}`);
    const c = ctl();
    Atomics.store(c, 2, tableAt);
    Atomics.store(c, 3, step);
    Atomics.add(c, 0, 1);
    Atomics.notify(c, 0);
    const words = new Int32Array(memory.buffer, tableAt, 2);
    try {
      ex.run(words[0], words[1], step);
    } catch (err) {
      broken = String(err);
      Atomics.store(c, 10, 1); // the barrier's abort word: the others stop too
      Atomics.notify(c, 9);
      throw err;
    }
  }

  function stopThreads() {
    if (!workers.length) return;
    const c = ctl();
    Atomics.store(c, 1, 1);
    Atomics.add(c, 0, 1);
    Atomics.notify(c, 0);
    workers.length = 0;
  }

  return { alloc, read, write, call, writeFromSlices, writeFromBuffer, zero, copy, table,
           memoryBytes: () => memory.buffer.byteLength, threads: want, threadsNote, barrier, runThreads, stopThreads,
           shared: typeof SharedArrayBuffer !== "undefined" && memory.buffer instanceof SharedArrayBuffer };
}
return makeTallowWasm;
