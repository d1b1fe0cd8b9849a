"""Whisper tiny.en on jfk.wav, greedy, 2 threads: tallow (numpy backend) against
faster-whisper (CTranslate2, float32, the same model.bin tallow's weights were
converted from), measured in the same run.

    python bench/whisper.py [--runs 3] [--threads 2] [--python-estimate]

Prints each side's best wall time over --runs (after one warm-up), the texts, and
the speed ratio. --python-estimate also times the pure-Python device on parts of
the model (one decoder step; one encoder layer on a short input) and extrapolates
a full 30 s window from them: a full pure-Python run takes far too long to measure.
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JFK = ROOT / "tests" / "data" / "jfk.wav"


def best_of(runs, fn):
    fn()  # warm-up: caches, thread pools, page cache
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def bench_tallow(runs):
    import tallow
    from tallow.models import whisper

    model = whisper.load(tallow.hub.fetch("whisper-tiny.en"), device="cpu", dtype="f32")

    def run():
        return model.transcribe(str(JFK), temperature=0.0, beam_size=None)

    seconds, result = best_of(runs, run)
    # where the time goes, for one run
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
    parts = f"mel {t1 - t0:.3f} s, encoder {t2 - t1:.3f} s, decoder {t3 - t2:.3f} s ({len(decoded.tokens)} tokens)"
    return seconds, result.text.strip(), parts, model


def ct2_model_dir():
    import tallow
    if "whisper-tiny.en-ct2" in tallow.hub.KNOWN:
        return Path(tallow.hub.fetch("whisper-tiny.en-ct2"))
    raise SystemExit("no CTranslate2 model: this tallow's hub has no 'whisper-tiny.en-ct2'")


def bench_faster_whisper(runs, threads):
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        return None, "faster-whisper is not installed (pip install faster-whisper)"
    model = WhisperModel(str(ct2_model_dir()), device="cpu", compute_type="float32", cpu_threads=threads)

    def run():
        segments, _ = model.transcribe(str(JFK), beam_size=1, temperature=0.0, language="en")
        return "".join(s.text for s in segments)

    seconds, text = best_of(runs, run)
    return seconds, text.strip()


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
    return layer_s, frames, encoder_s, step_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python-estimate", action="store_true")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before numpy loads its BLAS
    sys.path.insert(0, str(ROOT))

    print(f"Whisper tiny.en, {JFK.name} (11 s), greedy, float32, {args.threads} threads, best of {args.runs}")
    t_s, t_text, parts, model = bench_tallow(args.runs)
    print(f"tallow (numpy)         {t_s:7.3f} s  RTF {t_s / 11.0:.3f}   [{parts}]")
    print(f"   text: {t_text}")
    f_s, f_text = bench_faster_whisper(args.runs, args.threads)
    if f_s is None:
        print(f"faster-whisper: skipped: {f_text}")
    else:
        print(f"faster-whisper (ct2)   {f_s:7.3f} s  RTF {f_s / 11.0:.3f}")
        print(f"   text: {f_text}")
        print(f"tallow speed relative to faster-whisper: {f_s / t_s:.2f}x (target >= 0.5x); "
              f"same text: {t_text == f_text}")
    if args.python_estimate:
        layer_s, frames, encoder_s, step_s = python_estimate(model)
        print(f"pure-Python device: one encoder layer on {frames} frames {layer_s:.2f} s, "
              f"one decoder step {step_s:.2f} s; estimated 30 s window encoder {encoder_s / 60:.0f} min "
              f"+ {step_s:.1f} s per token")


if __name__ == "__main__":
    main()
