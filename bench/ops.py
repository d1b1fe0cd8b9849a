"""Tensor-core benchmark: tallow vs raw numpy vs PyTorch eager, measured in the same run.

Prints ratios (tallow time / peer time; lower is better):
* large matmul (1024^3) and large element-wise ops: the target is <= 1.1x numpy;
* per-op overhead on tiny tensors: the target is no worse than PyTorch eager;
* the pure-Python backend's 64^3 matmul vs a naive pure-Python triple loop.
"""
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np

import tallow


def best(fn, repeat=5, number=1):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def row(name, ours, peer, peer_name):
    print(f"{name:38s} tallow {ours * 1e3:9.3f} ms   {peer_name} {peer * 1e3:9.3f} ms   ratio {ours / peer:5.2f}x")


def main():
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}; threads {os.environ['OMP_NUM_THREADS']}")
    a, b = rng.standard_normal((1024, 1024), np.float32), rng.standard_normal((1024, 1024), np.float32)
    x, y = tallow.from_numpy(a, "cpu"), tallow.from_numpy(b, "cpu")
    row("matmul 1024^3 f32", best(lambda: x @ y), best(lambda: a @ b), "numpy")
    row("matmul 1024^3 f32, rhs transposed", best(lambda: x @ y.T), best(lambda: a @ b.T), "numpy")
    big_a, big_b = rng.standard_normal(4_000_000, np.float32), rng.standard_normal(4_000_000, np.float32)
    bx, by = tallow.from_numpy(big_a, "cpu"), tallow.from_numpy(big_b, "cpu")
    row("add 4M f32", best(lambda: bx + by), best(lambda: big_a + big_b), "numpy")
    row("mul 4M f32", best(lambda: bx * by), best(lambda: big_a * big_b), "numpy")
    row("exp 4M f32", best(lambda: bx.exp()), best(lambda: np.exp(big_a)), "numpy")
    row("sum 4M f32", best(lambda: bx.sum()), best(lambda: big_a.sum()), "numpy")

    print("\nper-op overhead on tiny tensors (4 elements)")
    ta, tb = tallow.tensor([1.0, 2.0, 3.0, 4.0], device="cpu"), tallow.tensor([1.0, 2.0, 3.0, 4.0], device="cpu")
    na, nb = np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    ours_add = best(lambda: ta + tb, number=2000)
    ours_exp = best(lambda: ta.exp(), number=2000)
    ours_view = best(lambda: ta.reshape(2, 2).T, number=2000)
    row("add (tiny)", ours_add, best(lambda: na + nb, number=2000), "numpy")
    try:
        import torch
        torch.set_num_threads(2)
        pa, pb = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
        row("add (tiny)", ours_add, best(lambda: pa + pb, number=2000), "torch")
        row("exp (tiny)", ours_exp, best(lambda: pa.exp(), number=2000), "torch")
        row("reshape+transpose view (tiny)", ours_view, best(lambda: pa.reshape(2, 2).T, number=2000), "torch")
    except ImportError:
        print("torch not installed: PyTorch rows skipped")

    print("\npure-Python backend")
    import random
    random.seed(0)
    n = 64
    la = [[random.random() for _ in range(n)] for _ in range(n)]
    lb = [[random.random() for _ in range(n)] for _ in range(n)]

    def naive():
        out = [[0.0] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                s = 0.0
                for k in range(n):
                    s += la[i][k] * lb[k][j]
                out[i][j] = s
        return out

    px, py = tallow.tensor(la, device="python"), tallow.tensor(lb, device="python")
    row("matmul 64^3 (python backend)", best(lambda: px @ py, repeat=3), best(naive, repeat=3), "naive loops")


if __name__ == "__main__":
    main()
