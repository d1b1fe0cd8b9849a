"""Benchmark of the pure-Python backend (prints figures; not a test).

Compares, in the same run: a 64^3 matmul against a naive triple-loop
pure-Python matmul, and softmax / layer_norm / a few element-wise ops on
64x512 against numpy when numpy is importable. Runs under Pyodide too
(numpy peers are then skipped).

    python bench/python_backend.py [--repeat N]
"""
import argparse
import random
import time

from tallow import dtypes as D
from tallow.backends.operand import Operand
from tallow.backends.python_backend import PythonBackend
from tallow.layout import Layout


def best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def naive_matmul(a, b, m, k, n):
    out = [0.0] * (m * n)
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for p in range(k):
                acc += a[i * k + p] * b[p * n + j]
            out[i * n + j] = acc
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    be = PythonBackend()
    rnd = random.Random(0)
    print(f"python backend: {be.features()}")

    m = k = n = 64
    a_vals = [rnd.gauss(0, 1) for _ in range(m * k)]
    b_vals = [rnd.gauss(0, 1) for _ in range(k * n)]
    a, b = be.from_list(a_vals, D.f32), be.from_list(b_vals, D.f32)
    la, lb = Layout((m, k)), Layout((k, n))
    t_backend = best_of(lambda: be.matmul(Operand(a, la), Operand(b, lb), D.f32), args.repeat)
    a32, b32 = a.tolist(), b.tolist()
    t_naive = best_of(lambda: naive_matmul(a32, b32, m, k, n), max(1, args.repeat // 2))
    print(f"matmul 64^3 f32     : backend {t_backend * 1e3:8.2f} ms | naive triple loop {t_naive * 1e3:8.2f} ms"
          f" | {t_naive / t_backend:5.1f}x faster")
    lbt = Layout((n, k)).permute((1, 0))  # a transposed operand (as x @ W.T in Linear)
    t_t = best_of(lambda: be.matmul(Operand(a, la), Operand(b, lbt), D.f32), args.repeat)
    print(f"matmul 64^3 b^T     : backend {t_t * 1e3:8.2f} ms")

    try:
        import numpy as np
    except ImportError:
        np = None

    rows, cols = 64, 512
    x_vals = [rnd.gauss(0, 2) for _ in range(rows * cols)]
    x = be.from_list(x_vals, D.f32)
    lx = Layout((rows, cols))
    w = be.full(cols, 1.0, D.f32)
    bias = be.full(cols, 0.0, D.f32)
    lw = Layout((cols,))
    xn = np.array(x_vals, np.float32).reshape(rows, cols) if np else None

    def np_softmax():
        e = np.exp(xn - xn.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def np_layer_norm():
        c = xn - xn.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)

    cases = [
        ("softmax 64x512 f32", lambda: be.softmax(x, lx, D.f32), np_softmax),
        ("softmax 64x512 f16", lambda: be.softmax(x, lx, D.f16), None),
        ("layer_norm 64x512", lambda: be.layer_norm(Operand(x, lx), Operand(w, lw), Operand(bias, lw), D.f32, 1e-5),
         np_layer_norm),
        ("rms_norm 64x512", lambda: be.rms_norm(Operand(x, lx), Operand(w, lw), D.f32, 1e-6), None),
        ("gelu 64x512", lambda: be.unary("gelu", x, lx, D.f32), None),
        ("add 64x512 + row", lambda: be.binary("add", x, lx, w, lw.broadcast_to((rows, cols)), D.f32),
         (lambda: xn + xn[0]) if np else None),
        ("sum over last dim", lambda: be.reduce("sum", x, lx, D.f32, (1,)), (lambda: xn.sum(-1)) if np else None),
        ("transpose copy", lambda: be.copy(x, lx.permute((1, 0)), D.f32),
         (lambda: np.ascontiguousarray(xn.T)) if np else None),
    ]
    for name, fn, peer in cases:
        t = best_of(fn, args.repeat)
        line = f"{name:20s}: backend {t * 1e3:8.2f} ms"
        if peer is not None and np is not None:
            tp = best_of(peer, args.repeat)
            line += f" | numpy {tp * 1e3:8.3f} ms | {t / tp:6.0f}x numpy's time"
        print(line)


if __name__ == "__main__":
    main()
