#!/usr/bin/env python3
"""A voice assistant loop: microphone (or --wav FILE) -> Whisper -> a chat LLM -> a text reply.

With a microphone, each turn records until --listen-seconds of audio (or a pause:
--silence seconds of quiet after speech), transcribes it, and streams the model's
reply. With --wav the file is one turn and the script exits after the reply.

    python edge/voice_assistant.py                      # microphone, best device
    python edge/voice_assistant.py --wav question.wav --max-tokens 64
"""
import argparse
import sys
import time

import tallow

from edge_common import SAMPLE_RATE, add_audio_arguments, audio_source, peak_rss_mb, pick_device, run_main

SYSTEM = "You are a helpful voice assistant on a small device. Answer in one or two short sentences."


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="voice_assistant", description=__doc__.split("\n")[0])
    p.add_argument("--asr-model", default="whisper-tiny.en", help="Whisper model name or directory")
    p.add_argument("--llm", default="smollm2-135m-instruct", help="chat model: a known name, a directory or a .gguf")
    p.add_argument("--max-tokens", type=int, default=96, help="longest reply, in tokens")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--listen-seconds", type=float, default=8.0, help="longest question (microphone)")
    p.add_argument("--silence", type=float, default=1.0, help="a pause this long ends a question (microphone)")
    p.add_argument("--turns", type=int, default=0, help="stop after this many turns (0: until Ctrl-C; --wav: 1)")
    add_audio_arguments(p, chunk_default=0.5)
    return p.parse_args(argv)


def _level(chunk):
    return max((abs(v) for v in chunk), default=0.0)


def listen(chunks, args):
    """Audio of one question: up to --listen-seconds, cut at a pause after speech (microphone)."""
    audio, quiet, heard = [], 0.0, False
    for chunk in chunks:
        audio.extend(chunk)
        if args.wav:
            continue  # a file is one whole question
        loud = _level(chunk) > 0.02
        heard = heard or loud
        quiet = 0.0 if loud else quiet + len(chunk) / SAMPLE_RATE
        if (heard and quiet >= args.silence) or len(audio) >= args.listen_seconds * SAMPLE_RATE:
            break
    return audio


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    chunks = iter(audio_source(args))
    asr = tallow.load_model(args.asr_model, device=device)
    llm = tallow.load_model(args.llm, device=device)
    history = [{"role": "system", "content": SYSTEM}]
    turns = 1 if args.wav else args.turns
    done = 0
    print(f"# {args.asr_model} + {args.llm} on {device}; speak now", file=sys.stderr, flush=True)
    while not turns or done < turns:
        audio = listen(chunks, args)
        if not audio:
            break
        start = time.perf_counter()
        question = asr.transcribe(audio, language="en", timestamps=False, temperature=0.0).text.strip()
        heard = time.perf_counter()
        print(f"you: {question}", flush=True)
        if not question:
            continue
        history.append({"role": "user", "content": question})
        print("assistant: ", end="", flush=True)
        # A long session outgrows the context window: forget the oldest turns rather than stop.
        reply = llm.chat(history, stream=True, max_tokens=args.max_tokens, temperature=args.temperature,
                         history_policy="drop_oldest")
        history = reply.messages
        text = ""
        for piece in reply:
            text += piece
            print(piece, end="", flush=True)
        print(flush=True)
        history.append({"role": "assistant", "content": text.strip()})
        print(f"# heard in {heard - start:.1f} s; reply {len(reply.token_ids)} tokens at "
              f"{reply.decode_tokens_per_second:.1f} tok/s", file=sys.stderr, flush=True)
        done += 1
    rss = peak_rss_mb()
    if rss:
        print(f"# peak RSS {rss:.0f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main("voice_assistant", main)
