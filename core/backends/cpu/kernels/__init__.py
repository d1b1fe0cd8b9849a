"""The CPU device's kernels, one source: numba loops over GGUF blocks and float32 arrays, the LLVM
vector IR they inline, and their machine code cached per machine (loaded later without numba).
The only modules of tallow that import numba or llvmlite; every file here is part of the machine
code's cache key (machine_code.py).

  codes.py        format/activation codes, the f16 table, GELU's erf constants and the step
                  program's op codes: what the kernels and their callers share, without numba
  float_rows.py   blocks dequantised to float32 rows (embeddings, a prompt's BLAS tiles) and f16 products
  int_dot.py      decoding-step products: activations quantised to int16, integer dots on the blocks
  int_tiles.py    prompt products: activations quantised to int8 once, integer GEMM tiles (weight rows x
                  activation rows per inner loop, byte products) on every block format, threads split rows
  int_tiles_32.py q4_0 / q5_0 / q8_0 prompt products: weight rows unpacked once per product, 512-bit
                  lanes that are blocks (8 byte products, then 3 float ops per 16 blocks and row pair)
  fused_ops.py    the fused decode ops (add+norm, rope+cache write, cache attention), GELU, softmax rows
  step_loop.py    run_step: a captured decode step's whole program in one nogil call per thread
  batch_attention.py  one call a layer for a batched decoding step: each row's fused_ops.cache_attention
                  on its own cache, found by address (rows stay bitwise equal to single steps)
  vector_ir.py    LLVM vector IR intrinsics: block unpacking, integer and f16 dots (numba inlines them)
  kquant_ir.py    the K-quants' (q4_k, q5_k, q6_k) dot loop: activations requantised to int8 as read,
                  byte dots (vpdpbusd / vpmaddubsw), one float op per block and row; vector_ir's
                  kernel uses it and hands it its IR helpers (bind)
  arm_ir.py       aarch64's byte dots for kquant_ir: sdot (ARMv8.2 dotprod) where the target has it
  atomics.py      atomic loads/adds and a spin hint as numba intrinsics (threads share chunks of rows)
  machine_code.py the kernels compiled once as C-callable objects in $TALLOW_HOME/cpu_kernels/<key>/,
                  loaded with llvmlite alone (`tallow warmup` fills it)
  numba_setup.py  numba prepared before any kernel loads (no scipy BLAS import; LLVM pages released)
  llvm_pages.py   hand back the pages of LLVM's library that a compile or load touched
"""
