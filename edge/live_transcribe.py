#!/usr/bin/env python3
"""Live transcription: microphone (or --wav FILE fed in chunks) -> Whisper -> text.

Every --step seconds of new audio the current utterance is transcribed again and
printed as a partial line ("... text"); when it reaches --segment seconds, or the
audio ends, the last transcription is printed as final ("> text") and a new
utterance starts.

    python edge/live_transcribe.py                       # microphone, best device
    python edge/live_transcribe.py --wav talk.wav --realtime --device cuda
"""
import argparse
import sys
import time

import tallow

from edge_common import SAMPLE_RATE, add_audio_arguments, audio_source, peak_rss_mb, pick_device, run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="live_transcribe", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="whisper-tiny.en", help="Whisper model name or directory")
    p.add_argument("--step", type=float, default=3.0, help="seconds of new audio between partial results")
    p.add_argument("--segment", type=float, default=20.0, help="finalise an utterance at this length (<= 30 s)")
    p.add_argument("--language", default="en")
    add_audio_arguments(p)
    return p.parse_args(argv)


def transcribe(model, samples, language):
    return model.transcribe(samples, language=language, timestamps=False, temperature=0.0).text.strip()


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    source = audio_source(args)  # checks the audio input before the model loads
    model = tallow.load_model(args.model, device=device)
    print(f"# {args.model} on {device}; listening", file=sys.stderr, flush=True)
    utterance, since_partial, text = [], 0, ""
    busy = audio = 0.0
    for chunk in source:
        utterance.extend(chunk)
        since_partial += len(chunk)
        audio += len(chunk) / SAMPLE_RATE
        if since_partial >= args.step * SAMPLE_RATE:
            start = time.perf_counter()
            text = transcribe(model, utterance, args.language)
            busy += time.perf_counter() - start
            since_partial = 0
            if len(utterance) >= args.segment * SAMPLE_RATE:
                print(f"> {text}", flush=True)
                utterance, text = [], ""
            else:
                print(f"... {text}", flush=True)
    if utterance:
        start = time.perf_counter()
        text = transcribe(model, utterance, args.language)
        busy += time.perf_counter() - start
        print(f"> {text}", flush=True)
    rss = peak_rss_mb()
    print(f"# {audio:.1f} s of audio, {busy:.1f} s transcribing on {device}"
          + (f", peak RSS {rss:.0f} MiB" if rss else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main("live_transcribe", main)
