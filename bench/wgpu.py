"""wgpu backend throughput vs numpy, measured in the same run.

    python bench/wgpu.py [--quick] [--no-models] [--prefill-only]

matmul: GFLOP/s at 512^3 and 1024^3 (f32), for a @ b and for x @ w.T (a
Linear layer's form, the vec4 matmul_rows kernel). matvec (one decoding
token): GB/s of weights read, for an f32 (n, k) weight and for the same weight
in Q8_0 / Q4_0 / Q4_1 / Q4_K blocks dequantised inside the kernel; numpy's
peers are `x @ w.T` (what the numpy backend does with its cached f32 copy of
quantised weights) and tallow.quant.qmatmul_numpy (dequantise + dot). GPU
timings include one readback per batch of `reps` dispatches (the sync point),
as a model's forward pass would.

prefill: GFLOP/s of the matmuls of more than one row, per kernel candidate (simple: the
registers-only kernels tuned on lavapipe; tiled64/tiled32: workgroup-tiled, for real GPUs), on
SmolLM2-135M's Q4_1 projections at m = 65..512 prompt rows and Whisper tiny.en's encoder
(1500 frames: fc1 and the attention scores), and which candidate the per-adapter measurement
(wgpu_backend/tuning.py) picks here. CPU-emulated adapters (lavapipe) say nothing about GPUs.

models (unless --no-models): Whisper tiny.en transcribing jfk.wav, and
SmolLM2-135M-Instruct prefill / greedy decode tokens per second, on wgpu and
on numpy ("cpu") in the same run.
"""
import os
import sys
import time

# This script shares its name with the `wgpu` package: keep `python bench/wgpu.py`
# from importing itself when the driver does `import wgpu`.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np  # noqa: E402

from tallow import dtypes as D  # noqa: E402
from tallow.backends.operand import Operand, QuantWeight  # noqa: E402
from tallow.layout import Layout  # noqa: E402
from tallow_wgpu.backend import WgpuBackend  # noqa: E402


def best(fn, reps):
    fn()  # warm-up: pipeline compilation, pool
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) / reps)
    return min(times)


def prefill(be, quick):
    """GFLOP/s of prefill/encoder matmuls per kernel candidate, and the measured choice."""
    from tallow_wgpu import tuning
    rng = np.random.default_rng(0)

    def rate(flops, fn):
        fn()  # compiles the kernel
        t = time.perf_counter()
        fn()
        return flops / (time.perf_counter() - t) / 1e9

    # SmolLM2-135M: hidden 576, q/k/v joined 960 rows, gate/up joined 3072, down 1536 -> 576; Q4_1 blocks
    q41 = D.get_dtype("q4_1")
    layers = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    weights = [(n, k, be.from_bytes(rng.integers(0, 256, q41.nbytes(n * k), dtype=np.uint8).tobytes(), q41))
               for n, k in layers]
    for _, _, w in weights:  # sane f16 scales: random bytes make NaNs and infinities
        blocks = np.frombuffer(be.to_bytes(w, Layout((w.nbytes,)), D.u8), np.uint8).reshape(-1, 20).copy()
        blocks[:, 0:4] = np.full((len(blocks), 2), 0.01, np.float16).view(np.uint8)
        be.driver.write(w.buf, 0, blocks.tobytes())
    from tallow_wgpu.matmul import QMATVEC_MAX_ROWS
    for m in ((128,) if quick else (QMATVEC_MAX_ROWS, QMATVEC_MAX_ROWS + 1, 128, 256, 512)):
        x = be.from_bytes(rng.standard_normal((m, 1536), dtype=np.float32).tobytes(), D.f32)
        flops = sum(2 * m * n * k for n, k, _ in weights)
        rates = {}
        # up to QMATVEC_MAX_ROWS rows the decode kernel (qmatvec) runs: timed next to the prefill kernels
        for choice in (("qmatvec",) if m <= QMATVEC_MAX_ROWS else ()) + tuning.CANDIDATES["qmatmul"]:
            def layer():
                out = None
                for n, k, w in weights:
                    out, wb = be._new(m * n, D.f32), be._bind(w, "bench")
                    if choice == "qmatvec":
                        be._qmatmul_piece(wb, x, out, m, n, k, q41.nbytes(k), 0, D.f32, q41, ("quant_common", "q4_1"))
                    else:
                        be.qmatmul_with(choice, wb, x, out, m, n, k, q41.nbytes(k), 0, D.f32, q41)
                be.to_bytes(out, Layout((1,)), D.f32)
            rates[choice] = rate(flops, layer)
        print(f"prefill smollm2 Q4_1 layer, m={m}: " + "   ".join(f"{c} {r:6.2f} GFLOP/s" for c, r in rates.items()))
    # Whisper tiny.en encoder, 1500 frames: fc1 (384 -> 1536, f32 weights) and q . k^T over 6 heads of 64
    f, d = (500, 384) if quick else (1500, 384)
    xs = be.from_bytes(rng.standard_normal((f, d), dtype=np.float32).tobytes(), D.f32)
    ws = be.from_bytes(rng.standard_normal((1536, d), dtype=np.float32).tobytes(), D.f32)
    qk = be.from_bytes(rng.standard_normal((6, f, 64), dtype=np.float32).tobytes(), D.f32)
    head = f * 64
    shapes = [  # name, FLOPs, a, b, matmul words (m n k batch, a: offset/batch/row/col strides, b: the same)
        ("fc1 x @ w.T", 2 * f * d * 1536, xs, ws, [f, 1536, d, 1, 0, 0, d, 1, 0, 0, 1, d]),
        ("attention q @ k^T", 2 * 6 * f * f * 64, qk, qk, [f, f, 64, 6, 0, head, 64, 1, 0, head, 1, 64]),
    ]
    for name, flops, a, b, words in shapes:
        numel = words[0] * words[1] * words[3]
        rates = {}
        for choice in tuning.CANDIDATES["matmul"]:
            def mm():
                out = be._new(numel, D.f32)
                be.matmul_with(choice, a, b, out, words, D.f32)
                be.to_bytes(out, Layout((1,)), D.f32)
            rates[choice] = rate(flops, mm)
        print(f"whisper encoder {name} ({f} frames): " + "   ".join(f"{c} {r:6.2f} GFLOP/s" for c, r in rates.items()))
    for family in ("matmul f32", "qmatmul q4_1"):
        rec = be.tuning.tune(family)
        times = ", ".join(f"{c} {s * 1e3:.1f} ms" for c, s in rec["seconds"].items())
        print(f"measured choice for {family} on this adapter: {rec['choice']} (per run at {rec['shape']}: {times})")


def main():
    quick = "--quick" in sys.argv
    be = WgpuBackend()
    feats = be.features()
    print(f"adapter: {feats['adapter']} ({feats['backend_type']}, cpu_emulated={feats['cpu_emulated']}); "
          f"numpy {np.__version__}")
    prefill(be, quick)
    if "--prefill-only" in sys.argv:
        return
    rng = np.random.default_rng(0)

    for size in ((512,) if quick else (512, 1024)):
        a = rng.standard_normal((size, size), dtype=np.float32)
        b = rng.standard_normal((size, size), dtype=np.float32)
        sa, sb = be.from_bytes(a.tobytes(), D.f32), be.from_bytes(b.tobytes(), D.f32)
        lay = Layout((size, size))
        reps = 1

        def gpu():
            out = None
            for _ in range(reps):
                out = be.matmul(Operand(sa, lay), Operand(sb, lay), D.f32)
            be.to_bytes(out, Layout((1,)), D.f32)  # sync

        flops = 2 * size ** 3
        t_gpu = best(gpu, reps)
        t_np = best(lambda: a @ b, 1)
        out = be.matmul(Operand(sa, lay), Operand(sb, lay), D.f32)
        got = np.frombuffer(be.to_bytes(out, lay, D.f32), np.float32).reshape(size, size)
        err = float(np.abs(got - a @ b).max())
        print(f"matmul {size}^3 f32: wgpu {flops / t_gpu / 1e9:7.2f} GFLOP/s   numpy {flops / t_np / 1e9:7.2f} GFLOP/s"
              f"   ratio {t_np / t_gpu:.3f}   max|diff| {err:.1e}")
        lbt = Layout((size, size)).permute((1, 0))  # a @ b.T: rows of both operands contiguous

        def gpu_t():
            be.to_bytes(be.matmul(Operand(sa, lay), Operand(sb, lbt), D.f32), Layout((1,)), D.f32)

        t_gpu = best(gpu_t, 1)
        t_np = best(lambda: a @ b.T, 1)
        print(f"matmul {size}^3 f32 x @ w.T: wgpu {flops / t_gpu / 1e9:7.2f} GFLOP/s   numpy "
              f"{flops / t_np / 1e9:7.2f} GFLOP/s   ratio {t_np / t_gpu:.3f}")

    import tallow.quant as q
    n, k = (1536, 576) if quick else (4096, 2048)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    sx = be.from_bytes(x.tobytes(), D.f32)
    lx = Layout((1, k))
    reps = 20
    sw = be.from_bytes(w.tobytes(), D.f32)
    lw = Layout((n, k)).permute((1, 0))  # x @ w.T, as a Linear layer does

    def gpu_f32():
        out = None
        for _ in range(reps):
            out = be.matmul(Operand(sx, lx), Operand(sw, lw), D.f32)
        be.to_bytes(out, Layout((1,)), D.f32)

    t_gpu = best(gpu_f32, reps)
    t_np = best(lambda: x @ w.T, 1)
    nbytes = w.nbytes
    print(f"matvec f32 ({n}x{k}): wgpu {nbytes / t_gpu / 1e9:6.2f} GB/s   numpy {nbytes / t_np / 1e9:6.2f} GB/s"
          f"   ratio {t_np / t_gpu:.3f}")

    for name in ("q8_0", "q4_0", "q4_1") + (() if k % 256 else ("q4_k",)):
        qdt = D.get_dtype(name)
        blocks = q.quantize_numpy(w, name)
        raw = np.asarray(blocks).tobytes()
        qw = be.from_bytes(raw, qdt)

        def gpu_q():
            out = None
            for _ in range(reps):
                out = be.qmatmul(Operand(sx, lx), QuantWeight(qw, qdt, n, k), D.f32)
            be.to_bytes(out, Layout((1,)), D.f32)

        t_gpu = best(gpu_q, reps)
        t_np = best(lambda: q.qmatmul_numpy(x, raw, qdt, n, k), 1)
        t_np_f32 = best(lambda: x @ w.T, 1)
        out = be.qmatmul(Operand(sx, lx), QuantWeight(qw, qdt, n, k), D.f32)
        got = np.frombuffer(be.to_bytes(out, Layout((1, n)), D.f32), np.float32)
        err = float(np.abs(got - q.qmatmul_numpy(x, raw, qdt, n, k).reshape(-1)).max())
        print(f"matvec {name} ({n}x{k}, {len(raw) / 1e6:.1f} MB): wgpu {len(raw) / t_gpu / 1e9:6.2f} GB/s   "
              f"numpy (dequantise + dot) {len(raw) / t_np / 1e9:6.2f} GB/s   ratio {t_np / t_gpu:.3f}   "
              f"max|diff| {err:.1e}   vs numpy f32 x @ w.T: {t_np_f32 / t_gpu:.2f}x the speed")

    if "--no-models" not in sys.argv:
        models(quick)


def models(quick):
    """Whisper tiny.en on jfk.wav and SmolLM2 decoding, wgpu vs numpy ("cpu")."""
    import tallow
    from tallow.generation import TextStream, chat_prompt_ids, generate_ids
    from tallow.models import whisper
    jfk = os.path.join(os.path.dirname(_here), "tests", "data", "jfk.wav")
    whisper_dir = tallow.hub.fetch("whisper-tiny.en", progress=False)
    for device in ("wgpu", "cpu"):
        model = whisper.load(whisper_dir, device=device)
        model.transcribe(jfk, temperature=0.0, timestamps=False)  # warm-up: pipelines, caches
        t = time.perf_counter()
        text = model.transcribe(jfk, temperature=0.0, timestamps=False).text.strip()
        took = time.perf_counter() - t
        print(f"whisper tiny.en jfk.wav (11.0 s of audio) on {device}: {took:.2f} s   real-time factor "
              f"{took / 11.0:.2f}   {text!r}")
    smol = tallow.hub.fetch("smollm2-135m-instruct", progress=False)
    tokens = 8 if quick else 32
    for device in ("wgpu", "cpu"):
        model = tallow.load_model(smol, device=device)
        ids = chat_prompt_ids(model, [{"role": "user", "content": "What is the capital of France?"}])
        list(generate_ids(model, ids, max_tokens=2, stop_tokens=[], cache=model.new_cache()))  # warm-up
        stats = TextStream(iter(()))
        got = list(generate_ids(model, ids, max_tokens=tokens, stop_tokens=[], cache=model.new_cache(), stats=stats))
        print(f"smollm2-135m Q4_1 on {device}: prefill {len(ids)} tokens {stats.prefill_tokens_per_second:.1f} tok/s, "
              f"decode {stats.decode_tokens_per_second:.2f} tok/s over {len(got)} tokens   "
              f"{model.tokenizer.decode(got)[:40]!r}")


if __name__ == "__main__":
    main()
