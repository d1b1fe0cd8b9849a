"""One-token decode attention over a long KV cache on wgpu, with and without split-K.

    python bench/cache_attention.py [--keys 2048] [--reps 20]

Times functional.cache_attention (rotate q and k, append k and v to the cache, attend) in
SmolLM2-135M's shape (9 query heads over 3 KV heads of 64 features) with the cache holding
`keys` keys of a cache of that capacity: one workgroup per query head (split-K off), and
the keys split among workgroups of KEYS_PER_SPLIT plus the dispatch that joins them (as
wgpu_backend/attention.py chooses for that capacity). Both in the same run, with one readback
per batch of `reps` calls (the sync point). Prints the adapter, and says so when it is a
CPU emulator (lavapipe, SwiftShader): there the workgroups share a few CPU cores, so the
figure says nothing about a real GPU, where split-K exists to fill idle compute units.
"""
import argparse
import os
import sys
import time

# bench/wgpu.py shares its name with the `wgpu` package: keep the driver's `import wgpu` off it.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np  # noqa: E402

import tallow  # noqa: E402
from tallow import functional as F  # noqa: E402
from tallow_wgpu import attention as wgpu_attention  # noqa: E402


def time_calls(dev, keys, reps, split):
    wgpu_attention.SPLIT_K_MIN_KEYS = 1 if split else 1 << 30
    rng = np.random.default_rng(0)
    h, hk, d = 9, 3, 64
    cache = [tallow.from_numpy(rng.standard_normal((1, hk, keys, d)).astype(np.float32), device=dev)
             for _ in range(2)]
    q, k, v = (tallow.from_numpy(rng.standard_normal((1, n, 1, d)).astype(np.float32), device=dev)
               for n in (h, hk, hk))
    ang = (keys - 1) * 10000.0 ** (-np.arange(d // 2) / (d // 2))
    cos, sin = (tallow.from_numpy(f(ang)[None].astype(np.float32), device=dev) for f in (np.cos, np.sin))

    def call():
        return F.cache_attention(q, k, v, cache[0], cache[1], keys - 1, cos, sin)
    call().numpy()  # warm-up: pipelines built
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            out = call()
        out.numpy()
        best = min(best, (time.perf_counter() - t) / reps * 1e3)
    return best, out.numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = tallow.Device("wgpu")
    feats = dev.backend.features()
    emulated = " (a CPU emulator: not a GPU figure)" if feats.get("cpu_emulated") else ""
    print(f"adapter: {feats.get('adapter')}{emulated}")
    keep = wgpu_attention.SPLIT_K_MIN_KEYS
    try:
        one, ref = time_calls(dev, args.keys, args.reps, False)
        split, got = time_calls(dev, args.keys, args.reps, True)
    finally:
        wgpu_attention.SPLIT_K_MIN_KEYS = keep
    splits = min(wgpu_attention.MAX_SPLITS, -(-args.keys // wgpu_attention.KEYS_PER_SPLIT))
    print(f"{args.keys} keys, 9 query heads / 3 KV heads x 64: one workgroup per head {one:.3f} ms/call; "
          f"split-K ({splits} splits of {wgpu_attention.KEYS_PER_SPLIT} keys + combine) {split:.3f} ms/call "
          f"(max difference {np.abs(got - ref).max():.1e})")


if __name__ == "__main__":
    main()
