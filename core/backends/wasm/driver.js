// JS half of tallow.backends.wasm.driver_browser: kernels.wasm instantiated over a
// WebAssembly.Memory this file owns, with a bump allocator (the Python driver keeps the free
// lists), byte reads and writes, export calls, and writes of a Blob's slices (a Cache API entry
// or a picked file, read by worker.mjs's SlicedFile) straight into the memory, never through
// the Python heap.
//
// This file is evaluated with `new Function(text)()`: its last statement returns the factory.
async function makeTallowWasm(moduleBytes) {
  const PAGE = 65536;
  const ALIGN = 16; // every range starts on a SIMD128 boundary
  const align = (n) => Math.ceil(n / ALIGN) * ALIGN;
  const module = await WebAssembly.compile(moduleBytes);
  const memory = new WebAssembly.Memory({ initial: 64 }); // the module asks for a few pages (stack, constants)
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
  return { alloc, read, write, call, writeFromSlices, writeFromBuffer, zero, copy, table, memoryBytes: () => memory.buffer.byteLength };
}
return makeTallowWasm;
