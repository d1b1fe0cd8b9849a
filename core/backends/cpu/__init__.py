"""The CPU device (Device("cpu")): numpy arrays as storage, numba kernels on the GGUF blocks where
numba is installed (`pip install 'tallow[cpu]'`), numpy and BLAS everywhere else. Shaped like the
GPU packages: a backend, its kernels, and the runtime that runs them. Imports run one way:
backend -> runtime -> kernels -> tallow.quant (the block formats); nothing here is imported by
tallow.quant, and only kernels/ imports numba or llvmlite.

  backend.py      NumpyBackend: the Backend subclass and its ops (numpy, BLAS, and the kernels
                  through runtime/kernel_calls.py once a quantised model or Whisper asks for them)
  attention.py    many-query attention blocked so the scores stay in cache (Whisper's encoder, prompts)
  gelu.py         exact GELU on float32 without scipy (a numpy polynomial, or the fused_ops kernel)
  mapped_pages.py hand back a weights file's pages once their bytes were copied (madvise)
  runtime/        what runs the kernels: which ones load, threads, and captured decode steps
  kernels/        the one kernel source: numba loops, the LLVM vector IR they inline, and the
                  cache of their machine code (loaded without numba)
"""
