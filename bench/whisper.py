"""Whisper tiny.en on jfk.wav, greedy: tallow (numpy backend) against faster-whisper
(CTranslate2, the same model.bin tallow's weights were converted from), float32 and
int8, measured in the same run, at 2 threads and at 1.

    python bench/whisper.py [--runs 3] [--threads 2,1] [--python-estimate]

Each thread count runs in its own process (BLAS reads its thread count when numpy
loads). In it the four engines -- tallow f32, tallow int8 (`quantize="q8_0"`: q8_0
weights, integer-dot kernels), faster-whisper float32 and int8 -- each warm up once,
then take turns for --runs rounds, and each keeps its best wall time: on a box shared
with other work, interleaving spreads a burst of load over all four instead of one.
Each engine also reports its best CPU time (all its threads): on a busy box the wall
time swells with waiting for a core, the CPU time much less. The last line is the
first thread count's wall-time ratios (faster-whisper's time over tallow's, so > 1
means tallow is faster):

    whisper_vs_faster_whisper f32=X int8=Y

--python-estimate also times the pure-Python device on parts of the model (one
decoder step; one encoder layer on a short input) and extrapolates a full 30 s
window from them: a full pure-Python run takes far too long to measure.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JFK = ROOT / "tests" / "data" / "jfk.wav"
SECONDS = 11.0  # jfk.wav's length


def words(text):
    return re.sub(r"[^a-z ]", "", text.lower()).split()


def tallow_engine(quantize):
    import tallow
    from tallow.models import whisper

    model = whisper.load(tallow.hub.fetch("whisper-tiny.en"), device="cpu", dtype="f32", quantize=quantize)

    def run():
        return model.transcribe(str(JFK), temperature=0.0, beam_size=None).text.strip()
    return model, run


def parts(model):
    """Where one run's time goes: the first mel window, the encoder, the decoder (per token)."""
    from tallow.models.whisper_decoding import DecodingOptions, decode
    from tallow.models.whisper_transcribe import _Mel
    t0 = time.perf_counter()
    window = _Mel(str(JFK), 80, model.mel_filters).window(0)  # reads, decodes and computes the first window
    t1 = time.perf_counter()
    features = model.encode(window)
    features.numpy()
    t2 = time.perf_counter()
    decoded = decode(model, features, DecodingOptions(language="en"))
    t3 = time.perf_counter()
    n = len(decoded.tokens)
    return (f"mel {t1 - t0:.3f} s, encoder {t2 - t1:.3f} s, decoder {t3 - t2:.3f} s "
            f"({n} tokens, {1000 * (t3 - t2) / max(n, 1):.1f} ms each)"), decoded.tokens


def ct2_model_dir():
    import tallow
    if "whisper-tiny.en-ct2" in tallow.hub.KNOWN:
        return Path(tallow.hub.fetch("whisper-tiny.en-ct2"))
    raise SystemExit("no CTranslate2 model: this tallow's hub has no 'whisper-tiny.en-ct2'")


def faster_whisper_engine(compute_type, threads):
    from faster_whisper import WhisperModel
    model = WhisperModel(str(ct2_model_dir()), device="cpu", compute_type=compute_type, cpu_threads=threads)

    def run():
        segments, _ = model.transcribe(str(JFK), beam_size=1, temperature=0.0, language="en")
        return "".join(s.text for s in segments).strip()
    return run


def measure(threads, runs):
    """{engine: {"seconds", "text"}} plus tallow's breakdowns, in this process (threads already set)."""
    sys.path.insert(0, str(ROOT))
    engines, report = {}, {"threads": threads, "runs": runs, "load": os.getloadavg()[0]}
    f32_model, engines["tallow f32"] = tallow_engine(None)
    q8_model, engines["tallow int8"] = tallow_engine("q8_0")
    try:
        import ctranslate2
        import faster_whisper
        report["peer"] = f"faster-whisper {faster_whisper.__version__}, CTranslate2 {ctranslate2.__version__}"
        engines["faster-whisper f32"] = faster_whisper_engine("float32", threads)
        engines["faster-whisper int8"] = faster_whisper_engine("int8", threads)
    except ImportError:
        report["skipped"] = "faster-whisper is not installed (pip install faster-whisper)"
    texts = {name: run() for name, run in engines.items()}  # warm-up: caches, thread pools, JIT
    best = dict.fromkeys(engines, float("inf"))
    cpu = dict.fromkeys(engines, float("inf"))
    for _ in range(runs):
        for name, run in engines.items():
            t, c = time.perf_counter(), time.process_time()
            texts[name] = run()
            best[name] = min(best[name], time.perf_counter() - t)
            cpu[name] = min(cpu[name], time.process_time() - c)
    report["engines"] = {name: {"seconds": best[name], "cpu": cpu[name], "text": texts[name]} for name in engines}
    report["blas"] = blas_note()
    report["load"] = f"{report['load']:.1f} -> {os.getloadavg()[0]:.1f}"  # the box's 1-minute load average
    report["tallow f32 parts"], f32_tokens = parts(f32_model)
    report["tallow int8 parts"], q8_tokens = parts(q8_model)
    same = sum(a == b for a, b in zip(f32_tokens, q8_tokens))
    report["int8 tokens"] = f"{same} of {len(f32_tokens)} equal to float's (int8 has {len(q8_tokens)})"
    report["f32 model"] = f32_model
    return report


def blas_note():
    """numpy's BLAS and the kernels it runs: OPENBLAS_CORETYPE in the environment can pin
    OpenBLAS to older kernels than the CPU has (AVX2 on an AVX-512 CPU halves its float32
    products), which faster-whisper's own libraries do not read."""
    try:
        from threadpoolctl import threadpool_info
        libs = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} kernels"
                for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        libs = ["unknown (threadpoolctl is not installed)"]
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return ", ".join(libs) + (f" (OPENBLAS_CORETYPE={pinned} in the environment)" if pinned else "")


def ratio(report, kind):
    e = report["engines"]
    peer = e.get(f"faster-whisper {kind}")
    return None if peer is None else peer["seconds"] / e[f"tallow {kind}"]["seconds"]


def print_report(r):
    print(f"\n{r['threads']} thread(s), best of {r['runs']} interleaved runs (a shared box: "
          f"other work adds noise; load average {r['load']}); {r.get('peer', 'no faster-whisper')}")
    print(f"  numpy's BLAS: {r['blas']}")
    for name, e in r["engines"].items():
        print(f"  {name:20s} {e['seconds']:7.3f} s  RTF {e['seconds'] / SECONDS:.3f}  "
              f"(CPU {e['cpu']:6.3f} s)  {e['text']}")
    print(f"  tallow f32  parts: {r['tallow f32 parts']}")
    print(f"  tallow int8 parts: {r['tallow int8 parts']}; tokens: {r['int8 tokens']}")
    if "skipped" in r:
        print(f"  faster-whisper: skipped: {r['skipped']}")
        return
    e = r["engines"]
    for kind in ("f32", "int8"):
        ours, peer = e[f"tallow {kind}"]["text"], e[f"faster-whisper {kind}"]["text"]
        cpu_ratio = e[f"faster-whisper {kind}"]["cpu"] / e[f"tallow {kind}"]["cpu"]
        print(f"  {kind}: tallow is {ratio(r, kind):.2f}x faster-whisper's speed (CPU time: {cpu_ratio:.2f}x); "
              f"same words: {words(ours) == words(peer)}, same text: {ours == peer}")


def python_estimate(cpu_model):
    """Time parts of the model on the pure-Python device and extrapolate one 30 s window."""
    import tallow
    from tallow.models import whisper

    model = whisper.load(cpu_model.name, device="python")
    enc = model.encoder
    frames = 100
    x = tallow.zeros(1, frames, model.config.d_model, device="python")
    t = time.perf_counter()
    enc.layers[0](x)
    layer_s = time.perf_counter() - t
    # attention grows with frames^2, the rest with frames: scale the parts separately
    d, f = model.config.d_model, model.config.encoder_ffn_dim
    lin = 4 * d * d + 2 * d * f
    full_frames = model.config.max_source_positions
    per_mac = layer_s / (frames * lin + 2 * frames * frames * d)
    layer_full = per_mac * (full_frames * lin + 2 * full_frames * full_frames * d)
    conv = per_mac * (2 * full_frames * 80 * d * 3 + full_frames * d * d * 3)
    encoder_s = layer_full * len(enc.layers) + conv
    features = cpu_model.encode(tallow.zeros(1, 80, 3000)).to("python")
    state = model.start(features)
    model.decode_step([[model.tokens.sot]], state)
    t = time.perf_counter()
    model.decode_step([[220]], state)
    step_s = time.perf_counter() - t
    print(f"pure-Python device: one encoder layer on {frames} frames {layer_s:.2f} s, "
          f"one decoder step {step_s:.2f} s; estimated 30 s window encoder {encoder_s / 60:.0f} min "
          f"+ {step_s:.1f} s per token")


def child(threads, runs, estimate):
    """One thread count, in this process: prints the JSON report as its last line."""
    from tallow.settings import tune_process
    tune_process()  # as the CLI does, before numpy loads (OpenBLAS's thread timeout, malloc policy)
    report = measure(threads, runs)
    model = report.pop("f32 model")
    if estimate:
        python_estimate(model)
    print(json.dumps(report))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="2,1", help="thread counts, comma-separated (default 2,1)")
    ap.add_argument("--python-estimate", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if args.child:
        return child(counts[0], args.runs, args.python_estimate)

    print(f"Whisper tiny.en, {JFK.name} (11 s), greedy, tallow (numpy) vs faster-whisper (CTranslate2); "
          f"threads {args.threads}, best of {args.runs}")
    reports = []
    for i, threads in enumerate(counts):
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            env[var] = str(threads)  # before numpy (and numba) load
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads), "--runs", str(args.runs)]
        if args.python_estimate and i == 0:
            cmd.append("--python-estimate")
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()
        for line in out[:-1]:
            print(line)
        reports.append(json.loads(out[-1]))
        print_report(reports[-1])
    first = reports[0]
    if "skipped" not in first:
        print(f"whisper_vs_faster_whisper f32={ratio(first, 'f32'):.2f} int8={ratio(first, 'int8'):.2f}")


if __name__ == "__main__":
    main()
