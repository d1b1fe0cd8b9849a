"""The wasm device's package (issue 31): WasmBackend (`Device("wasm")`) and its kernels, the CPU device's LLVM vector IR
(cpu/kernels/vector_ir.py, kquant_ir.py) lowered to WebAssembly with SIMD128, so the page
without a GPU computes at wasm-SIMD speed and the two CPU targets share one kernel source.
core/device.py imports backend.py for device "wasm" (docs/wasm.md: the wasm device).

  backend.py     WasmBackend: GpuBackend's planning over a WasmDriver, its kernel table launching
                 these exports; everything else is an UnsupportedError naming the device and the op
  device_ir.py   kernels the device needs beside the rest: argmax_f32

  kernels_ir.py  the kernel module as LLVM IR (triple wasm32-unknown-unknown): GGUF block
                 products and dequantisation from the CPU generators, activation quantisation,
                 f32 rows, add + RMS norm, softmax, SiLU, GELU
  decode_ir.py   the decoder-layer kernels beside those: rope, the KV-slot copy, attention of one
                 token over the cache (GQA), SwiGLU's silu_mul, add_f32
  program.py     the call-list format (opcodes, argument kinds) and encode(): standard library only
  program_ir.py  the `run(program, count, step)` export: a recorded step's calls in one call
  module_ir.py   the three above as the one IR module build.py lowers
  build.py       IR -> object (llvmlite) -> kernels.wasm (wasm-ld, memory imported), cached by a
                 hash of the kernel sources; `python -m tallow.backends.wasm.build` ships it here
  native.py      kernels.wasm under wasmtime: the tests, the bench, and later device="wasm" natively
  driver.py      WasmDriver: the driver protocol's wasm-call form over four memory hooks
  driver_native.py  WasmtimeDriver: those hooks over native.py
  driver_browser.py, driver.js  BrowserWasmDriver (Pyodide): a WebAssembly.Memory owned by JS
  kernels.wasm   the built module (git-ignored; package data of the wheel, copied into the web site)
"""
