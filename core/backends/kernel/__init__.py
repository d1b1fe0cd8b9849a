"""The kernel-driven backend shared by CUDA (tallow_cuda) and Metal (tallow_metal): the op-by-op
host logic that picks a kernel, packs its arguments and hands one launch to a *driver*. Both
kernel sets (CUDA C, MSL) have the same kernel names and argument lists, so this package holds
all the logic and the backends add only their driver, their dense matmul and their custom-op
source. Neither tallow_cuda nor tallow_metal imports the other; both import this.

  backend.py   KernelBackend (the contract over a driver) and DeviceStorage (one tensor's memory)
  host.py      op codes, dtype names, argument kinds (I32, I64, U32, U64, F64, Meta), the strided
               `meta` array, launch grids, value packing; pure Python, testable without a GPU
  recording.py one captured step (tallow.capture): its launches, the step buffer, replay
  null_driver.py a driver that does nothing and counts launches (bench/kernel_host.py)
  emulator.py  test-only: build a kernel source with g++ and launch it on the CPU (cpu_fibers.h)

The driver protocol (what KernelBackend calls; CuPy, PyObjC Metal and the two CPU emulators
implement it):

  name: str                      the device name used in error messages ("cuda", "metal")
  has_f64: bool                  False: f64 tensors are refused with UnsupportedError (Metal)
  atomic64: bool                 False: scatter_add into 8-byte dtypes is refused (Metal)
  alloc(dtype, numel)            -> DeviceStorage of numel elements (bytes for block dtypes), zeroed
  upload(data, dtype)            -> DeviceStorage holding these little-endian bytes
  download(st, byte_offset, nbytes) -> bytes of st from byte_offset (waits for pending launches)
  launch(module, kernel, grid, block, args)
                                 runs kernel `kernel` of kernel file `module` ("elementwise",
                                 "reduce", "index", "attention", "quant", or what load_source
                                 returned) on a (x, y, z) grid of (x, y, z) blocks; args are
                                 DeviceStorage buffers and host.I32/I64/U32/U64/F64/Meta values,
                                 in the kernel's parameter order
  load_source(name, source)      -> a module handle for a CustomOp's kernel source, compiled once
  write(st, byte_offset, data)   bytes over part of st in place (a captured step's inputs and step buffer)

and, for capture and replay (tallow.capture; recording.py), optionally:

  replays: bool                  True: record and replay work (KernelBackend.can_capture)
  record(entries)                -> a handle for a captured step's entries (launches as launch takes
                                 them, and host calls): CuPy captures a CUDA graph, Metal prepares
                                 the pipelines and argument bytes, the emulators keep the list
  replay(handle)                 runs it again (the step buffer is already written)

A backend subclass provides `matmul` (cuBLAS, a tiled MSL kernel, numpy on the emulator) and
`custom_source(op)` (the op's `cuda` or `msl` text).
"""
