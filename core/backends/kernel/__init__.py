"""The kernel-driven backend shared by CUDA (tallow_cuda) and Metal (tallow_metal): the op-by-op
host logic that picks a kernel, packs its arguments and hands one launch to a *driver*. Both
kernel sets (CUDA C, MSL) have the same kernel names and argument lists, so this package holds
all the logic and the backends add only their driver, their dense matmul and their custom-op
source. Neither tallow_cuda nor tallow_metal imports the other; both import this.

  backend.py   KernelBackend (the contract over a driver) and DeviceStorage (one tensor's memory)
  host.py      op codes, dtype names, argument kinds (I32, I64, U32, U64, F64, Meta), the strided
               `meta` array, launch grids, value packing; pure Python, testable without a GPU
  recording.py what a captured step's entries are here (their signature; relaunch); the recording
               itself is tallow/backends/step_recording.py, the one class every GPU backend uses
  null_driver.py a driver that does nothing and counts launches (bench/kernel_host.py)
  emulator.py  test-only: build a kernel source with g++ and launch it on the CPU (cpu_fibers.h)

The drivers (CuPy, PyObjC Metal, the two CPU emulators, the null driver) implement the kernel
form of the one GPU driver protocol, documented in tallow/backends/driver_protocol.py: alloc,
upload, download, write, launch, load_source, and record/replay for captured steps.

A backend subclass provides `matmul` (cuBLAS, a tiled MSL kernel, numpy on the emulator) and
`custom_source(op)` (the op's `cuda` or `msl` text).
"""
