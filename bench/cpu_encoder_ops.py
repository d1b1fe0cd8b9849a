"""Per-op timing of Whisper tiny's encoder ops on the CPU device, one layer's worth:
GELU on the (1500, 1536) fc1 output and self-attention over (1, 6, 1500, 64),
each way tallow has of computing it, best of --runs, wall and CPU time.

    OPENBLAS_NUM_THREADS=1 python bench/cpu_encoder_ops.py [--runs 7]

Set the BLAS thread count in the environment: OpenBLAS reads it when numpy loads.
"""
import argparse
import math
import os
import time

from tallow.settings import tune_process

tune_process()  # OpenBLAS's settings, before numpy loads it (as the CLI does)

import numpy as np  # noqa: E402

from tallow.backends.cpu import attention, gelu  # noqa: E402


def best(fn, runs):
    fn()  # warm-up (and numba's compilation)
    wall, cpu = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return f"{1000 * min(wall):7.2f} ms wall {1000 * min(cpu):7.2f} ms CPU"


def plain_attention(q, k, v, scale):
    """The numpy backend's path for few queries: all heads' scores at once."""
    s = np.matmul(q * np.float32(scale), np.swapaxes(k, -1, -2))
    s -= np.max(s, axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= np.sum(s, axis=-1, keepdims=True)
    return np.matmul(s, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    rng = np.random.default_rng(0)
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')} "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT')} load average {os.getloadavg()[0]:.1f}")
    x = rng.standard_normal((1500, 1536)).astype(np.float32)
    try:
        import numba  # noqa: F401  (gelu runs its kernel only once numba is loaded)
    except ImportError:
        pass
    ways = {"gelu numpy polynomial": lambda: gelu._gelu_numpy(x)}
    if gelu._kernel() is not None:
        ways["gelu numba kernel"] = lambda: gelu.gelu(x)
    try:
        from scipy.special import erf
        ways["gelu scipy erf (before)"] = lambda: 0.5 * x * (1.0 + erf(x * np.float32(1 / math.sqrt(2))))
    except ImportError:
        pass
    q, k, v = (rng.standard_normal((1, 6, 1500, 64)).astype(np.float32) for _ in range(3))
    ways["attention all heads at once (before)"] = lambda: plain_attention(q, k, v, 0.125)
    ways["attention blocked (attention)"] = lambda: attention.attention(q, k, v, None, 0.125, False)
    for name, fn in ways.items():
        print(f"  {name:38s} {best(fn, runs)}")


if __name__ == "__main__":
    main()
