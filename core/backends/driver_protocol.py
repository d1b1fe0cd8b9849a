"""The one driver protocol of tallow's GPU backends: what WgpuBackend (wgpu_backend/backend.py)
and KernelBackend (CUDA and Metal, core/backends/kernel/backend.py) call on their driver. The
backends decide everything (kernel, parameters, launch grid, buffer reuse); a driver only moves
bytes, compiles and launches. Nine drivers implement it (the wasm two under WasmBackend, core/backends/wasm/backend.py):

  wgpu (the WGSL launch form):  tallow_wgpu.driver_native.NativeDriver (the `wgpu` package),
                                tallow_wgpu.driver_browser.BrowserDriver (navigator.gpu in Pyodide),
                                tallow_wgpu.driver_null.NullDriver (does nothing; counts dispatches)
  CUDA / Metal (the kernel form): tallow_cuda.driver.CupyDriver, tallow_metal.driver.MetalDriver,
                                the CPU emulators (tallow.backends.kernel.emulator.EmulatedDriver),
                                tallow.backends.kernel.null_driver.NullKernelDriver
  wasm (the wasm-call form):    tallow.backends.wasm.driver_native.WasmtimeDriver (kernels.wasm
                                under wasmtime), tallow.backends.wasm.driver_browser.BrowserWasmDriver
                                (its WebAssembly.Memory owned by JS in Pyodide)

A *buffer* below is the handle the driver's alloc returned: a DeviceStorage (buffer, dtype,
numel) on the kernel drivers; a bare GPU buffer on the wgpu drivers, whose backend keeps dtypes
and sizes itself (WgpuStorage) and reuses buffers through its pool (wgpu_backend/pool.py).

Every driver (`Driver`):
  name                          the driver's name in messages and `tallow devices` ("cuda", "metal";
                                wgpu: "native", "browser", "null")
  can_replay                    True: record/replay work, so the backend captures steps (tallow.capture)
  alloc(dtype, numel)           a buffer of numel elements of dtype (bytes for block dtypes; the wgpu
                                backend asks for u8). Zeroed, except CuPy's: the kernel backend writes
                                every element before it reads it
  download(buf, byte_offset, nbytes)  those bytes; waits for the work launched before it
  write(buf, byte_offset, data) bytes over part of buf in place, ordered after the work launched before
                                it (a captured step's inputs and its step buffer, an upload)
  record(entries)               a handle for one captured step's entries, prepared once: the recording
                                class is core/backends/step_recording.py; an entry is what the form's
                                launch call takes (below). CuPy captures a CUDA graph, Metal prepares
                                pipelines and argument bytes, native wgpu one bind group per dispatch and
                                its parameters in a uniform buffer of their own, the browser the same in
                                JS, the emulators keep the list, the null drivers count it
  replay(handle)                runs the recorded step again (its step buffer already written): one
                                CUDA graph launch, one Metal command buffer, one JS call in the browser

The kernel form (`KernelDriver`): CUDA C / MSL kernels take their arguments in order.
  has_f64, atomic64             False: f64 tensors / 64-bit scatter_add are refused (Metal)
  upload(data, dtype)           a new buffer holding these little-endian bytes
  launch(module, kernel, grid, block, args)
                                kernel `kernel` of kernel file `module` ("elementwise", "reduce", "index",
                                "attention", "quant", or what load_source returned) over a (x, y, z) grid of
                                (x, y, z) blocks; args are buffers and host.I32/I64/U32/U64/F64/Meta values
                                in the kernel's parameter order. A recorded entry is
                                ("launch", module, kernel, grid, block, args), or ("call", fn, signature)
                                for a host-side op (cuBLAS, numpy) that a replay runs again by calling fn
  load_source(name, source)     a module handle for a CustomOp's kernel source, compiled once

The WGSL launch form (`WgslDriver`): a WGSL kernel takes its buffers as bindings 1, 2, ... and
its scalars as one uniform of parameter words at binding 0, so a launch names a compiled
pipeline, binding ranges and parameter bytes instead of arguments in order.
  info, limits, has_f16, cpu_emulated   the adapter: its description, the WebGPU limits the backend plans
                                with, shader-f16, and whether it is CPU-emulated (lavapipe, SwiftShader)
  pipeline(wgsl, label)         a compiled kernel, once per source text
  dispatch(pipeline, bindings, params, workgroups)
                                one kernel: bindings are (buffer, byte_offset, nbytes) for bindings 1..,
                                params the bytes of binding 0, workgroups (x, y, z). Dispatches are queued
                                and submitted at sync points (download, write, flush). A recorded entry is
                                (pipeline, bindings, params, workgroups)
  alloc_uniform(nbytes)         a small uniform buffer (a captured step's step buffer: WGSL reads it
                                as a uniform, core/backends/step_buffer.py)
  copy(src, src_offset, dst, dst_offset, nbytes)  a buffer-to-buffer copy, queued in order
  flush()                       submit what is queued, without waiting
  reads_js_buffers              True (the browser only): write_from_js(buf, offset, array_buffer,
                                src_offset, nbytes) copies a JS ArrayBuffer straight to the GPU
There is no `upload` in this form: the wgpu backend uploads into a pooled buffer (alloc, then write).

The wasm-call form (`WasmDriver`): kernels.wasm's exports take i32 byte addresses and counts, and
float32 values (core/backends/wasm/program.py lists them).
  step                          the buffer of the step words (position, token) a recorded program's
                                StepArgs read; write it before replay
  upload(data, dtype)           a new buffer holding these bytes
  launch(kernel, args)          call export `kernel` now; args are buffers (their address),
                                (buffer, byte offset), ints, floats, or StepArgs over those. A recorded
                                entry is ("call", kernel, args); record() writes the step's entries
                                as one program, and replay() is one call of the module's `run`

tests/test_driver_protocol.py checks that every driver has its form's members with these
parameter names.
"""
from typing import Any, Protocol


class Driver(Protocol):
    name: str
    can_replay: bool

    def alloc(self, dtype: Any, numel: int) -> Any: ...

    def download(self, buf: Any, byte_offset: int, nbytes: int) -> bytes: ...

    def write(self, buf: Any, byte_offset: int, data: Any) -> None: ...

    def record(self, entries: list) -> Any: ...

    def replay(self, handle: Any) -> None: ...


class KernelDriver(Driver, Protocol):
    has_f64: bool
    atomic64: bool

    def upload(self, data: Any, dtype: Any) -> Any: ...

    def launch(self, module: Any, kernel: str, grid: tuple, block: tuple, args: list) -> None: ...

    def load_source(self, name: str, source: str) -> Any: ...


class WgslDriver(Driver, Protocol):
    info: dict
    limits: dict
    has_f16: bool
    cpu_emulated: bool
    reads_js_buffers: bool

    def pipeline(self, wgsl: str, label: str) -> Any: ...

    def dispatch(self, pipeline: Any, bindings: list, params: bytes, workgroups: tuple) -> None: ...

    def alloc_uniform(self, nbytes: int) -> Any: ...

    def copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None: ...

    def flush(self) -> None: ...


class WasmDriver(Driver, Protocol):
    step: Any

    def upload(self, data: Any, dtype: Any) -> Any: ...

    def launch(self, kernel: str, args: list) -> None: ...


def nbytes_of(dtype, numel):
    """The bytes alloc(dtype, numel) holds: numel elements, or numel bytes of a block dtype."""
    return numel if dtype.is_quantized else numel * dtype.itemsize
