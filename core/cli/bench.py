"""`tallow bench`: speed of the real models on this box: Whisper's real-time factor on
a speech file and a chat model's prefill/decode tokens per second, on the chosen device.
Figures are for this machine only; nothing is compared or gated."""
import json
import os
import sys
import time

from .args import positive_int


def add_arguments(parser):
    parser.add_argument("--device", default=None, help="cpu, python, cuda, metal, wgpu (default: the best here)")
    parser.add_argument("--whisper", default="whisper-tiny.en", help="Whisper model name or directory")
    parser.add_argument("--audio", default=None, help="speech file (default: jfk.wav, fetched on first use)")
    parser.add_argument("--llm", default="smollm2-135m-instruct", help="language model name, directory or .gguf")
    parser.add_argument("--prompt", default="Explain in one paragraph why the sky is blue.")
    parser.add_argument("--tokens", type=positive_int, default=32, help="tokens to generate")
    parser.add_argument("--repeat", type=positive_int, default=1, help="timed runs per model (the best is reported)")
    parser.add_argument("--skip-whisper", action="store_true")
    parser.add_argument("--skip-llm", action="store_true")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _jfk():
    from .. import hub
    path = hub.fetch("jfk.wav", progress=False)
    return os.path.join(path, "jfk.wav") if os.path.isdir(path) else os.fspath(path)


def bench_whisper(args, device):
    from ..models import load_model
    audio = args.audio or _jfk()
    start = time.perf_counter()
    model = load_model(args.whisper, device=device)
    load_s = time.perf_counter() - start
    best, result = None, None
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        result = model.transcribe(audio, timestamps=False, temperature=0.0)
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return {"model": args.whisper, "audio": os.path.basename(audio), "audio_seconds": round(result.duration, 2),
            "load_seconds": round(load_s, 2), "transcribe_seconds": round(best, 2),
            "real_time_factor": round(best / result.duration, 3) if result.duration else None,
            "text": result.text.strip()}


def bench_llm(args, device):
    from ..models import load_model
    start = time.perf_counter()
    model = load_model(args.llm, device=device)
    load_s = time.perf_counter() - start
    best = None
    for _ in range(max(1, args.repeat)):
        # temperature 0 and no stop: every run generates exactly --tokens tokens unless eos comes first.
        s = model.chat([{"role": "user", "content": args.prompt}], stream=True, max_tokens=args.tokens)
        text = "".join(s)
        run = {"prompt_tokens": s.prompt_tokens, "generated_tokens": len(s.token_ids),
               "prefill_tokens_per_second": round(s.prefill_tokens_per_second, 2),
               "decode_tokens_per_second": round(s.decode_tokens_per_second, 2), "text": text.strip()}
        if best is None or run["decode_tokens_per_second"] > best["decode_tokens_per_second"]:
            best = run
    return {"model": args.llm, "load_seconds": round(load_s, 2), **best}


def _peak_rss_mb():
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024)


def run(args):
    from ..device import Device, default_device
    device = Device(args.device) if args.device else default_device()  # DeviceError names what is missing
    report = {"device": str(device), "features": device.backend.features()}
    if not args.skip_whisper:
        report["whisper"] = bench_whisper(args, device)
        if not args.json:
            w = report["whisper"]
            print(f"whisper  {w['model']} on {device}: {w['audio_seconds']} s of audio in {w['transcribe_seconds']} s, "
                  f"real-time factor {w['real_time_factor']} (load {w['load_seconds']} s)", flush=True)
    if not args.skip_llm:
        report["llm"] = bench_llm(args, device)
        if not args.json:
            g = report["llm"]
            print(f"llm      {g['model']} on {device}: prefill {g['prefill_tokens_per_second']} tok/s "
                  f"({g['prompt_tokens']} tokens), decode {g['decode_tokens_per_second']} tok/s "
                  f"({g['generated_tokens']} tokens) (load {g['load_seconds']} s)", flush=True)
    report["peak_rss_mb"] = _peak_rss_mb()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"peak RSS {report['peak_rss_mb']} MiB")
    return 0
