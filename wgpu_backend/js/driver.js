// JS half of tallow_wgpu.driver_browser: the per-dispatch work done in JS.
//
// Recording a dispatch from Python through Pyodide's `js` proxies costs
// 50-85 us (descriptor conversion + several proxy calls); here it is a few
// us. So Python only appends numbers to a list, and one call per submit
// (`submit`) creates the bind groups, encodes every dispatch and submits.
// Buffers and pipelines live in JS maps under integer ids; Python holds ids.
//
// This file is evaluated with `new Function(text)()`: its last statement
// returns the factory.
function makeTallowDriver(device, arenaBytes) {
  const buffers = new Map();
  const pipelines = new Map();
  let nextId = 1;
  const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  const arena = device.createBuffer({ size: arenaBytes, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });

  function createBuffer(nbytes) {
    const id = nextId++;
    buffers.set(id, device.createBuffer({ size: Math.max(4, nbytes), usage: STORAGE }));
    return id;
  }

  // A small uniform buffer: a captured step's position and key count (tallow.capture).
  function createUniform(nbytes) {
    const id = nextId++;
    buffers.set(id, device.createBuffer({ size: Math.max(16, nbytes), usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }));
    return id;
  }

  // A dropped buffer is only forgotten here; WebGPU keeps it alive until
  // submitted work that uses it is done.
  function forget(ids) {
    for (const id of ids) buffers.delete(id);
  }

  // Compile errors are caught by an error scope and thrown here, instead of
  // surfacing as uncaptured device errors in the console.
  async function compileAsync(code, label) {
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code, label });
    const info = await module.getCompilationInfo();
    const scoped = await device.popErrorScope();
    const errors = info.messages.filter((m) => m.type === "error");
    if (errors.length) {
      throw new Error(errors.map((m) => `line ${m.lineNum}:${m.linePos}: ${m.message}`).join("; "));
    }
    if (scoped) throw new Error(scoped.message);
    const p = await device.createComputePipelineAsync({ layout: "auto", compute: { module, entryPoint: "main" }, label });
    const id = nextId++;
    pipelines.set(id, { p, layout: p.getBindGroupLayout(0), label });
    return id;
  }

  function compileSync(code, label) {
    const module = device.createShaderModule({ code, label });
    const p = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" }, label });
    const id = nextId++;
    pipelines.set(id, { p, layout: p.getBindGroupLayout(0), label });
    return id;
  }

  // Python memory -> GPU without an extra copy: a view of the wasm heap.
  function writeFromPython(id, offset, pyBuffer, nbytes) {
    const view = pyBuffer.getBuffer("u8");
    try {
      device.queue.writeBuffer(buffers.get(id), offset, view.data, 0, nbytes);
    } finally {
      view.release();
    }
  }

  // A JS ArrayBuffer (e.g. a fetched weights file) -> GPU; it never enters the wasm heap.
  // writeBuffer wants a size that is a multiple of 4 (a Q8_0 tensor of 34-byte blocks may not
  // be): the last 1-3 bytes go through a 4-byte zero-padded copy (GPU buffers are 4-byte sized).
  function writeFromJs(id, offset, arrayBuffer, srcOffset, nbytes) {
    const buf = buffers.get(id);
    const body = nbytes - (nbytes % 4);
    if (body) device.queue.writeBuffer(buf, offset, arrayBuffer, srcOffset, body);
    if (body < nbytes) {
      const tail = new Uint8Array(4);
      tail.set(new Uint8Array(arrayBuffer, srcOffset + body, nbytes - body));
      device.queue.writeBuffer(buf, offset + body, tail.buffer, 0, 4);
    }
  }

  // A sliced file (an object with async read(offset, size) -> Uint8Array and sliceBytes: a Blob
  // too big for one ArrayBuffer) -> GPU, one slice at a time (queue.writeBuffer at offsets). Slices
  // are whole multiples of 4 bytes except the last, whose 1-3 trailing bytes are zero-padded.
  async function writeFromSlices(id, offset, file, srcOffset, nbytes) {
    const buf = buffers.get(id);
    const step = Math.max(4, file.sliceBytes - (file.sliceBytes % 4));
    for (let done = 0; done < nbytes; done += step) {
      const n = Math.min(step, nbytes - done);
      const bytes = await file.read(srcOffset + done, n);
      const body = n - (n % 4);
      if (body) device.queue.writeBuffer(buf, offset + done, bytes.buffer, bytes.byteOffset, body);
      if (body < n) {
        const tail = new Uint8Array(4);
        tail.set(bytes.subarray(body, n));
        device.queue.writeBuffer(buf, offset + done + body, tail.buffer, 0, 4);
      }
    }
  }

  // ops: flat u32 words, per entry:
  //   0 = dispatch: pipelineId, paramsSlotOffset, nBuffers, (bufId, offset, size) * n, x, y, z
  //   1 = copy:     srcId, srcOffset, dstId, dstOffset, nbytes
  function submit(ops, paramsPy, paramsBytes, paramsBytesLen) {
    if (paramsBytesLen) {
      const view = paramsPy.getBuffer("u8");
      try {
        device.queue.writeBuffer(arena, 0, view.data, 0, paramsBytesLen);
      } finally {
        view.release();
      }
    }
    const encoder = device.createCommandEncoder();
    let pass = null;
    let i = 0;
    const n = ops.length;
    while (i < n) {
      const kind = ops[i++];
      if (kind === 0) {
        const pipe = pipelines.get(ops[i++]);
        const slot = ops[i++];
        const nb = ops[i++];
        const entries = [{ binding: 0, resource: { buffer: arena, offset: slot, size: paramsBytes } }];
        for (let b = 0; b < nb; b++) {
          entries.push({ binding: b + 1, resource: { buffer: buffers.get(ops[i]), offset: ops[i + 1], size: ops[i + 2] } });
          i += 3;
        }
        const group = device.createBindGroup({ layout: pipe.layout, entries });
        if (pass === null) pass = encoder.beginComputePass();
        pass.setPipeline(pipe.p);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(ops[i], ops[i + 1], ops[i + 2]);
        i += 3;
      } else if (kind === 1) {
        if (pass !== null) {
          pass.end();
          pass = null;
        }
        encoder.copyBufferToBuffer(buffers.get(ops[i]), ops[i + 1], buffers.get(ops[i + 2]), ops[i + 3], ops[i + 4]);
        i += 5;
      } else {
        throw new Error(`tallow driver: bad op code ${kind} at ${i - 1}`);
      }
    }
    if (pass !== null) pass.end();
    device.queue.submit([encoder.finish()]);
  }

  // A captured step (tallow.capture): dispatches in submit()'s op format (dispatches only),
  // prepared once -- their parameters in a uniform buffer of their own, one bind group each --
  // and kept under an id. replay(id) encodes and submits them: one call per decoded token.
  const graphs = new Map();
  function record(ops, paramsPy, paramsBytes, paramsBytesLen) {
    const uniforms = device.createBuffer({ size: Math.max(paramsBytes, paramsBytesLen), usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    if (paramsBytesLen) {
      const view = paramsPy.getBuffer("u8");
      try {
        device.queue.writeBuffer(uniforms, 0, view.data, 0, paramsBytesLen);
      } finally {
        view.release();
      }
    }
    const steps = [];
    let i = 0;
    while (i < ops.length) {
      if (ops[i++] !== 0) throw new Error(`tallow driver: a captured step records dispatches only (op ${ops[i - 1]})`);
      const pipe = pipelines.get(ops[i++]);
      const slot = ops[i++];
      const nb = ops[i++];
      const entries = [{ binding: 0, resource: { buffer: uniforms, offset: slot, size: paramsBytes } }];
      for (let b = 0; b < nb; b++) {
        entries.push({ binding: b + 1, resource: { buffer: buffers.get(ops[i]), offset: ops[i + 1], size: ops[i + 2] } });
        i += 3;
      }
      steps.push([pipe.p, device.createBindGroup({ layout: pipe.layout, entries }), ops[i], ops[i + 1], ops[i + 2]]);
      i += 3;
    }
    const id = nextId++;
    graphs.set(id, { uniforms, steps });
    return id;
  }

  function replay(id) {
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const [p, group, x, y, z] of graphs.get(id).steps) {
      pass.setPipeline(p);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, y, z);
    }
    pass.end();
    device.queue.submit([encoder.finish()]);
  }

  function forgetGraphs(ids) {
    for (const id of ids) {
      const g = graphs.get(id);
      if (g !== undefined) g.uniforms.destroy();
      graphs.delete(id);
    }
  }

  // GPU -> a fresh ArrayBuffer (the caller awaits it: Python through run_sync).
  async function read(id, offset, nbytes) {
    const staging = device.createBuffer({ size: nbytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffers.get(id), offset, staging, 0, nbytes);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const out = staging.getMappedRange().slice(0);
    staging.unmap();
    staging.destroy();
    return out;
  }

  return {
    createBuffer, createUniform, forget, compileAsync, compileSync, writeFromPython, writeFromJs, writeFromSlices,
    submit, read, record, replay, forgetGraphs,
    liveBuffers: () => buffers.size, liveGraphs: () => graphs.size,
  };
}
return makeTallowDriver;
