"""kernels.wasm under wasmtime against the native CPU kernels, on the same matrices: SmolLM2-135M's
layer shapes (Q4_1: attn_q 576x576, ffn_gate 1536x576, ffn_down 576x1536; the Q8_0 output/embedding
49152x576), its own weights when the GGUF is in the tallow cache, random blocks otherwise; and
random Q4_K and Q6_K blocks of ffn_down's shape.

    python bench/wasm_kernels.py [--repeat 30]

Per product, one activation row (a decode step), best of --repeat: ns per 256 weight values for
wasm (quantize_row + matmul, one call each from Python) and the native kernel
(kernel_calls.qmatmul, one thread); both include their Python call costs, which on the small
matrices dominate wasm's (wasmtime-py spends ~0.1 ms a call: printed first; a call from JS into
wasm costs well under a microsecond). Then a whole decode step's products, 30 layers and the
output, as three large calls (every k=576 tensor stacked, every ffn_down stacked, the output):
90 MB streamed from memory, where the call costs vanish. Both on one core; read the ratio.
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = (("attn_q", "q4_1", 576, 576), ("ffn_gate", "q4_1", 1536, 576), ("ffn_down", "q4_1", 576, 1536),
          ("output", "q8_0", 49152, 576), ("k-quant", "q4_k", 576, 1536), ("k-quant", "q6_k", 576, 1536))
BLOCK = {"q4_1": (32, 20), "q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}  # values, bytes a block
SCALES_AT = {"q4_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}  # the f16 scale fields
# A SmolLM2-135M decode step: per layer q, k, v, o, gate, up, down (n x k), 30 layers; then the output.
STEP = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30


def _gguf():
    from tallow.settings import settings
    path = os.path.join(settings().home, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        return None
    from gguf import GGUFReader
    return {t.name: (t.tensor_type.name.lower(), np.ascontiguousarray(np.asarray(t.data).reshape(-1).view(np.uint8)))
            for t in GGUFReader(path).tensors}


def _random(q, n, k, rng):
    bs, bb = BLOCK[q]
    raw = rng.integers(0, 256, size=(n * k // bs, bb), dtype=np.uint8)
    for at in SCALES_AT[q]:
        raw[:, at:at + 2] = rng.uniform(-0.1, 0.1, size=(n * k // bs, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(-1)


def weights(tensors, name, q, n, k, rng):
    """blk.0's tensor (or token_embd for the output) from the cached GGUF, else random blocks."""
    want = "token_embd.weight" if name == "output" else f"blk.0.{name}.weight"
    if tensors and tensors.get(want, ("",))[0] == q:
        return tensors[want][1], "SmolLM2"
    return _random(q, n, k, rng), "random"


def step_matrices(tensors, rng):
    """A decode step's weights as three matrices (one call each): every layer's k=576 Q4_1 tensors
    stacked (q, k, v, o, gate, up), every ffn_down stacked (k=1536), the Q8_0 output: 90 MB that no
    cache holds, as in a real step."""
    if tensors:
        wide = [tensors[f"blk.{i}.{t}.weight"][1] for i in range(30)
                for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")]
        down = [tensors[f"blk.{i}.ffn_down.weight"][1] for i in range(30)]
        out = tensors["token_embd.weight"][1]
    else:
        wide = [_random("q4_1", n, 576, rng) for n, k in STEP if k == 576]
        down = [_random("q4_1", 576, 1536, rng) for _ in range(30)]
        out = _random("q8_0", 49152, 576, rng)
    n_wide = sum(n for n, k in STEP if k == 576)
    return [("q4_1", np.concatenate(wide), n_wide, 576), ("q4_1", np.concatenate(down), 30 * 576, 1536),
            ("q8_0", out, 49152, 576)]


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from tallow.backends.wasm import build
    from tallow.backends.wasm.native import Kernels
    if build.linker() is None:
        print("wasm_kernels: no wasm-ld (apt-get install lld): nothing to measure", file=sys.stderr)
        return 1
    wasm = Kernels(build.build())
    try:
        from tallow.backends.cpu.runtime import kernel_calls
        kernel_calls.set_threads(1)
    except ImportError:
        kernel_calls = None
    rng = np.random.default_rng(0)
    tensors = _gguf()
    empty = best(lambda: wasm("matmul_q4_1", 0, 0, 0, 0, 0, 0, 0, 0, 0), args.repeat * 10)
    print(f"an empty wasm call from Python (wasmtime-py): {empty / 1000:.0f} us")
    print(f"{'tensor':10s} {'fmt':5s} {'n x k':>11s} {'weights':8s} {'wasm':>8s} {'native':>8s}"
          "  (ns per 256 values, one row, cache-warm; both with their Python call costs)")
    for name, q, n, k in SHAPES:
        raw, origin = weights(tensors, name, q, n, k, rng)
        t_wasm, t_native = measure(wasm, kernel_calls, raw, q, n, k, rng, args.repeat)
        units = n * k / 256
        native = "-" if t_native is None else f"{t_native / units:8.1f}"
        print(f"{name:10s} {q:5s} {f'{n}x{k}':>11s} {origin:8s} {t_wasm / units:8.1f} {native:>8s}")
    totals = {"wasm": 0.0, "native": 0.0}
    for q, raw, n, k in step_matrices(tensors, rng):
        t_wasm, t_native = measure(wasm, kernel_calls, raw, q, n, k, rng, max(3, args.repeat // 5))
        totals["wasm"] += t_wasm / 1e6
        totals["native"] += (t_native or 0) / 1e6
    print(f"a whole decode step's products ({'SmolLM2' if tensors else 'random'} weights, 3 calls, 90 MB): "
          f"wasm {totals['wasm']:.1f} ms (~{1000 / totals['wasm']:.0f} tok/s if nothing else cost)"
          + (f", native {totals['native']:.1f} ms" if kernel_calls else ""))
    if kernel_calls:
        print(f"wasm_vs_native step={totals['native'] / totals['wasm']:.2f}")
    return 0


def measure(wasm, kernel_calls, raw, q, n, k, rng, repeat):
    """(wasm ns, native ns or None) for one activation row times the (n, k) matrix, best of repeat;
    the results are checked against each other first."""
    x = rng.standard_normal(k).astype(np.float32)
    mark = wasm.next
    at, xa = wasm.put(raw), wasm.put(x)
    qx, dx, sx, out = wasm.alloc(k * 2), wasm.alloc(k // 8), wasm.alloc(k // 8), wasm.alloc(n * 4)
    bs = BLOCK[q][0]

    def run_wasm():
        wasm("quantize_row", xa, k, qx, dx, sx)
        wasm(f"matmul_{q}", at, n, k // bs, 1, qx, dx, sx, wasm.table, out)
    t_wasm = best(run_wasm, repeat)
    t_native = None
    if kernel_calls is not None:
        x2 = x.reshape(1, k)
        want = kernel_calls.qmatmul(x2, raw, q, n, k).reshape(-1)
        got = wasm.get(out, (n,), np.float32)
        assert np.all(np.abs(got - want) <= 1e-4 * np.abs(want).max()), "wasm and native products differ"
        t_native = best(lambda: kernel_calls.qmatmul(x2, raw, q, n, k), repeat)
    wasm.next = mark  # the space is reused by the next matrix
    return t_wasm, t_native


if __name__ == "__main__":
    sys.exit(main())
