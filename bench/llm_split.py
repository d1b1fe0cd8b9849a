"""Where one decoded token's time goes on the CPU device (numba kernels): integer-dot products
by weight format and shape, the fused decode kernels, and the rest (Python: op front ends,
tensors, views, sampling), of an eager step; then the same step captured and replayed
(core/backends/cpu/runtime/capture.py: no Python between its kernels). Times are the thread's CPU
time (time.thread_time), not wall time: on a box whose cores other jobs share, wall time
measures the queue, while CPU time
still measures the work (each figure is the best token of --tokens, after a warm-up).

    python bench/llm_split.py [--gguf PATH] [--tokens 32] [--context 64]

One thread (TALLOW_THREADS=1, set here), so every kernel runs on the timed thread.
"""
import argparse
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=None)
    p.add_argument("--tokens", type=int, default=32, help="decoded tokens timed (the best one is reported)")
    p.add_argument("--context", type=int, default=64, help="prompt tokens before decoding")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.context < 1:
        p.error("--tokens and --context must be at least 1")
    os.environ["TALLOW_THREADS"] = "1"
    from tallow.settings import tune_process
    tune_process()  # as the CLI does, before numpy loads
    import numpy as np

    import tallow
    from tallow.backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        sys.exit("llm_split.py: the CPU kernels are off (numba missing or TALLOW_CPU=numpy)")
    gguf = args.gguf or os.fspath(tallow.hub.fetch("smollm2-135m-instruct", progress=False))
    model = tallow.load_model(gguf, device="cpu")
    token = int(model(list(range(100, 100 + args.context)), last_only=True).reshape(-1).argmax().item())
    for _ in range(3):  # warm-up: the kernels' first calls load them from numba's cache
        token = int(model([token], last_only=True).reshape(-1).argmax().item())

    ints, dec = kernel_calls._state["int"], kernel_calls.decode_kernels()
    fmt_names = {code: name for name, code in kernel_calls.kernels().FORMATS.items()}
    spent = {}  # what -> CPU seconds in the current token

    def timed(module, name, label):
        real = getattr(module, name)

        def wrapper(*a):
            t0 = time.thread_time()
            result = real(*a)
            key = label(a)
            spent[key] = spent.get(key, 0.0) + time.thread_time() - t0
            return result
        setattr(module, name, wrapper)
        return real

    def product(a):  # qmatmul_shared's arguments: format, ..., out (m, n), ..., gated
        return f"int-dot {fmt_names[a[0]]} {'gate+up ' if a[10] else ''}{a[3].size / 1e6:.2f} MB"

    saved = [(ints, "qmatmul_shared", timed(ints, "qmatmul_shared", product)),
             (ints, "quantize_rows", timed(ints, "quantize_rows", lambda a: "activation quantisation"))]
    for name in ("add_rms_norm", "add_layer_norm", "rope_kv_write", "kv_write", "attention", "cache_attention"):
        if hasattr(dec, name):  # (older trees lack some)
            saved.append((dec, name, timed(dec, name, lambda a: "fused decode kernels")))
    tokens = []
    model.capture_decode = False  # the eager step, op by op (a replay's kernels run inside one numba call)
    try:
        for _ in range(args.tokens):
            spent.clear()
            t0 = time.thread_time()
            token = int(model([token], last_only=True).reshape(-1).argmax().item())
            tokens.append((time.thread_time() - t0, dict(spent)))
    finally:
        for module, name, real in saved:
            setattr(module, name, real)
    total, parts = min(tokens, key=lambda t: t[0])
    median = float(np.median([t[0] for t in tokens]))
    print(f"one decoded token (thread CPU time, best of {args.tokens}; median {median * 1e3:.1f} ms): "
          f"{total * 1e3:.1f} ms")
    for key, secs in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {key:<40} {secs * 1e3:6.2f} ms")
    rest = total - sum(parts.values())
    print(f"  {'the rest (Python, numpy)':<40} {rest * 1e3:6.2f} ms")
    model.capture_decode = True  # the same step captured and replayed (core/backends/cpu/runtime/capture.py)
    replayed = []
    for _ in range(args.tokens + 2):  # (the first two capture)
        t0 = time.thread_time()
        token = int(model([token], last_only=True).reshape(-1).argmax().item())
        replayed.append(time.thread_time() - t0)
    captured = min(replayed[2:])
    print(f"one captured token (replayed, best of {args.tokens}): {captured * 1e3:.1f} ms")
    ints_ms = sum(v for k, v in parts.items() if k.startswith("int-dot")) * 1e3
    print(f"split_ms int_dot={ints_ms:.1f} other_kernels={(sum(parts.values()) * 1e3 - ints_ms):.1f} "
          f"python={rest * 1e3:.1f} total={total * 1e3:.1f} captured={captured * 1e3:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
