"""kernels.wasm's prompt and encoder products under wasmtime against numpy and tallow's CPU device,
one thread each, in the same run (OPENBLAS_NUM_THREADS=1 is set before numpy loads):

  * gemm_f32 / gemm_f16 (the 4x8 register-blocked GEMM of gemm_ir.py) against numpy's float32
    matmul (OpenBLAS) on Whisper tiny's encoder products (1500x384 . 384x384, 1500x384 . 1536x384)
    and a SmolLM2-135M prompt product (64x576 . 1536x576), in GFLOP/s;
  * a quantised prompt product, 64 rows times SmolLM2's ffn_gate (Q4_1, from the cached GGUF when
    there, random blocks otherwise) and random Q4_K / Q6_K 1536x512: gemm_q (dequantised panels, the
    f32 micro-kernel) against the integer 4-row tiles of matmul_<fmt> with the rows' quantize_row
    calls (both as one `run` program, so no Python call sits inside either);
  * whisper-tiny.en's encoder (tests/wasm_whisper_encoder.py: one program, one run call) against
    tallow's CPU device's `model.encode` on the same log-mel, when the model is in the tallow cache.

    python bench/wasm_gemm.py [--repeat 5]

Every wasm result is checked against numpy / the CPU device first. Read ratios, not times: the
box may be shared. The last line: `wasm_gemm f32=X f16=Y q_vs_tiles=Z encoder_vs_cpu=W` (wasm's
speed over its peer's; the GEMM figures are the geometric means over the shapes).
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("TALLOW_THREADS", "1")
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = (("whisper qkv/out", 1500, 384, 384), ("whisper fc1", 1500, 1536, 384), ("smollm2 prompt", 64, 1536, 576))
QUANT = (("ffn_gate", "q4_1", 1536, 576), ("random", "q4_k", 1536, 512), ("random", "q6_k", 1536, 512))


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _gflops(m, n, k, seconds):
    return 2 * m * n * k / seconds / 1e9


def float_gemms(wasm, rng, repeat):
    from tallow.backends.wasm.program import gemm_scratch_floats
    ratios = {"f32": [], "f16": []}
    print(f"{'product':16s} {'m x k . n x k':>20s} {'kind':4s} {'wasm':>8s} {'numpy':>8s} {'ratio':>6s}  (GFLOP/s)")
    for name, m, n, k in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        mark = wasm.next
        pa, out = wasm.put(a), wasm.alloc(m * n * 4)
        scratch = wasm.alloc(gemm_scratch_floats(k) * 4)
        for kind, dtype in (("f32", np.float32), ("f16", np.float16)):
            w = (rng.standard_normal((n, k)) * 0.1).astype(dtype)
            pw = wasm.put(w)
            w32 = w.astype(np.float32)

            def run():
                wasm(f"gemm_{kind}", pa, k, pw, k, 0, out, n, m, n, k, scratch)
            run()
            want = a @ w32.T
            assert np.allclose(wasm.get(out, (m, n), np.float32), want, rtol=1e-3, atol=1e-3), "wasm gemm differs"
            t_wasm, t_np = best(run, repeat), best(lambda: a @ w32.T, repeat)
            g_wasm, g_np = _gflops(m, n, k, t_wasm), _gflops(m, n, k, t_np)
            ratios[kind].append(g_wasm / g_np)
            print(f"{name:16s} {f'{m}x{k} . {n}x{k}':>20s} {kind:4s} {g_wasm:8.2f} {g_np:8.2f} {g_wasm / g_np:6.3f}")
        wasm.next = mark
    return {kind: float(np.exp(np.mean(np.log(r)))) for kind, r in ratios.items()}


def quant_gemms(wasm, rng, repeat):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from wasm_kernels import _gguf, _random
    from tallow.backends.cpu.kernels import codes
    from tallow.backends.wasm.kernels_ir import BLOCK_BYTES
    from tallow.backends.wasm.program import encode, gemm_scratch_floats
    from tallow.quant import dequantize_numpy
    tensors = _gguf()
    m = 64
    ratios = []
    print(f"{'weights':10s} {'fmt':5s} {'64 rows . n x k':>16s} {'gemm_q':>8s} {'tiles':>8s} {'ratio':>6s}  (GFLOP/s)")
    for name, q, n, k in QUANT:
        want_name = f"blk.0.{name}.weight"
        if tensors and tensors.get(want_name, ("",))[0] == q:
            raw, origin = tensors[want_name][1], "SmolLM2"
        else:
            raw, origin = _random(q, n, k, rng), "random"
        bs = 256 if q.endswith("_k") else 32
        blocks = k // bs
        assert raw.size == n * blocks * BLOCK_BYTES[q]
        a = rng.standard_normal((m, k)).astype(np.float32)
        mark = wasm.next
        pa, praw, out, out2 = wasm.put(a), wasm.put(raw), wasm.alloc(m * n * 4), wasm.alloc(m * n * 4)
        scratch = wasm.alloc(gemm_scratch_floats(k, quantised=True) * 4)
        qx, dx, sx = wasm.alloc(m * k * 2), wasm.alloc(m * k // 8), wasm.alloc(m * k // 8)
        code = list(codes.FORMATS).index(q)
        programs = []
        for calls in ([("gemm_q", (code, pa, k, praw, blocks, 0, out, n, m, n, wasm.table, scratch))],
                      [("quantize_row", (pa + 4 * i * k, k, qx + 2 * i * k, dx + i * k // 8, sx + i * k // 8))
                       for i in range(m)]
                      + [(f"matmul_{q}", (praw, n, blocks, m, qx, dx, sx, wasm.table, out2))]):
            words, count = encode(calls)
            programs.append((wasm.put(np.asarray(words, np.int32)), count))
        step = wasm.put(np.zeros(2, np.int32))
        runs = [lambda p=p: wasm("run", *p, step) for p in programs]
        for r in runs:
            r()
        w = dequantize_numpy(raw, q, n * k).reshape(n, k)
        want = a @ w.T
        scale = np.abs(a) @ np.abs(w).T
        assert np.all(np.abs(wasm.get(out, (m, n), np.float32) - want) <= 1e-5 * scale + 1e-6), "gemm_q differs"
        assert np.all(np.abs(wasm.get(out2, (m, n), np.float32) - want) <= 1e-2 * scale), "the tiles differ"
        t_q, t_tiles = best(runs[0], repeat), best(runs[1], repeat)
        g_q, g_t = _gflops(m, n, k, t_q), _gflops(m, n, k, t_tiles)
        ratios.append(g_q / g_t)
        print(f"{origin:10s} {q:5s} {f'{n}x{k}':>16s} {g_q:8.2f} {g_t:8.2f} {g_q / g_t:6.2f}")
        wasm.next = mark
    return float(np.exp(np.mean(np.log(ratios))))


def encoder(wasm, repeat):
    """(wasm seconds, CPU device seconds) for whisper-tiny.en's encoder on jfk.wav's log-mel, or None."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from wasm_whisper_encoder import MODEL_DIR, WasmWhisperEncoder
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"encoder: n/a ({MODEL_DIR} is not in the tallow cache: tallow fetch whisper-tiny.en)")
        return None
    import tallow
    from tallow.audio.load import load_audio
    from tallow.audio.mel import log_mel_spectrogram
    from tallow.models import whisper
    samples = np.asarray(load_audio(os.path.join(ROOT, "tests", "data", "jfk.wav")), np.float32)
    mel = np.asarray(log_mel_spectrogram(samples, padding=480000), np.float32)[:, :3000]
    enc = WasmWhisperEncoder(MODEL_DIR, wasm)
    model = whisper.load(MODEL_DIR, device="cpu", progress=False)
    x = tallow.tensor(mel[None])
    got, want = enc(mel), model.encode(x).numpy()[0]
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), "the wasm encoder differs from the CPU device's"
    t_wasm = best(lambda: enc(mel), repeat)
    t_cpu = best(lambda: model.encode(x).numpy(), repeat)
    print(f"whisper-tiny.en encoder, jfk.wav (30 s window), {enc.program[1]} calls in one run: "
          f"wasm {t_wasm:.2f} s, CPU device (1 thread) {t_cpu:.2f} s")
    return t_wasm, t_cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from tallow.backends.wasm import build
    from tallow.backends.wasm.native import Kernels
    if build.linker() is None:
        print("wasm_gemm: no wasm-ld (apt-get install lld): nothing to measure", file=sys.stderr)
        return 1
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass
    wasm = Kernels(build.build())
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.1f}; numpy BLAS threads: OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}")
    floats = float_gemms(wasm, rng, args.repeat)
    q = quant_gemms(wasm, rng, args.repeat)
    enc = encoder(wasm, max(1, args.repeat // 2))
    print(f"load average {os.getloadavg()[0]:.1f}")
    enc_ratio = "n/a" if enc is None else f"{enc[1] / enc[0]:.2f}"
    print(f"wasm_gemm f32={floats['f32']:.3f} f16={floats['f16']:.3f} q_vs_tiles={q:.2f} encoder_vs_cpu={enc_ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
