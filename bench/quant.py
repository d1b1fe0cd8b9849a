"""Quantised matmul on the numpy path: speed and memory of the choices.

For a 1536x576 (FFN-sized) and a 49152x576 (SmolLM2 vocab) weight in Q4_1 and
Q8_0, with x of 1 row (decoding) and 64 rows (prefill), compares
  f32 cached   : an f32 copy of the weight kept in memory, plain x @ w.T
  full dequant : dequantise the whole weight every call, then x @ w.T
  chunked      : tallow.quant.qmatmul_numpy (rows dequantised ~2 MB at a time)
  kernels      : the numba kernels on the blocks (tallow.backends.cpu.runtime.kernel_calls; integer dot
                 products for 1 row, tiles dequantised for BLAS for 64), when numba is installed
and prints time per call, the extra memory each needs, and the pure-Python
qmatmul on a small matrix. Run: python bench/quant.py
"""
import time
import tracemalloc
from array import array

import numpy as np

from tallow.backends.cpu.runtime import kernel_calls
from tallow.quant import dequantize_numpy, qmatmul_numpy, qmatmul_python, quantize_numpy


def best(f, reps=5):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def peak_mb(f):
    tracemalloc.start()
    f()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2 ** 20


def main():
    rng = np.random.default_rng(0)
    print(f"{'matrix':>10} {'type':>5} {'m':>3} | {'f32 cached':>10} {'full deq':>9} {'chunked':>9} "
          f"{'kernels':>8} ms | {'weights':>8} {'f32 copy':>8} {'full tmp':>8} {'chunk tmp':>9} MB")
    for n, k in ((1536, 576), (49152, 576)):
        w = rng.standard_normal((n, k)).astype(np.float32)
        for q in ("q4_1", "q8_0"):
            raw = quantize_numpy(w, q).reshape(-1)
            wf = dequantize_numpy(raw, q, n * k).reshape(n, k)
            for m in (1, 64):
                x = rng.standard_normal((m, k)).astype(np.float32)
                cached = best(lambda: x @ wf.T)
                full = best(lambda: x @ dequantize_numpy(raw, q, n * k).reshape(n, k).T)
                chunked = best(lambda: qmatmul_numpy(x, raw, q, n, k))
                kernels = (best(lambda: kernel_calls.qmatmul(x, raw, q, n, k)) if kernel_calls.supports(q)
                           else float("nan"))
                full_mem = peak_mb(lambda: x @ dequantize_numpy(raw, q, n * k).reshape(n, k).T)
                chunk_mem = peak_mb(lambda: qmatmul_numpy(x, raw, q, n, k))
                print(f"{n:>5}x{k:<4} {q:>5} {m:>3} | {cached:>10.2f} {full:>9.2f} {chunked:>9.2f} "
                      f"{kernels:>8.2f}    | {raw.nbytes / 2**20:>8.1f} {wf.nbytes / 2**20:>8.1f} "
                      f"{full_mem:>8.1f} {chunk_mem:>9.1f}")
    n, k = 256, 576
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = array("f", rng.standard_normal(k).astype(np.float32).tobytes())
    for q in ("q4_1", "q8_0"):
        raw = quantize_numpy(w, q).tobytes()
        t = best(lambda: qmatmul_python(x, raw, q, n, k), reps=2)
        print(f"pure Python qmatmul {q} {n}x{k}, m=1: {t:.1f} ms = {n * k / t / 1e3:.2f} M multiply-adds/s")


if __name__ == "__main__":
    main()
