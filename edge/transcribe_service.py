#!/usr/bin/env python3
"""A folder-watching transcription service: every new audio file in --watch gets a
.txt and an .srt next to it. Files already done (both outputs newer than the audio)
are skipped, so restarts are cheap; a file still being written (its size or mtime
changed within --settle seconds) waits for the next poll. Run it under systemd with
edge/tallow-transcribe.service.

    python edge/transcribe_service.py --watch /srv/recordings
    python edge/transcribe_service.py --watch ./inbox --once     # one pass, then exit
"""
import argparse
import os
import sys
import time

import tallow

from edge_common import peak_rss_mb, pick_device, run_main

AUDIO_EXTENSIONS = (".wav", ".wave", ".mp3", ".m4a", ".flac", ".ogg", ".opus", ".webm")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="transcribe_service", description=__doc__.split("\n")[0])
    p.add_argument("--watch", required=True, help="folder to watch (not recursive)")
    p.add_argument("--model", default="whisper-tiny.en", help="Whisper model name or directory")
    p.add_argument("--device", default=None, help="cpu, python, cuda, metal, wgpu (default: the best here)")
    p.add_argument("--language", default=None, help="language code (default: the model's, or detected)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    p.add_argument("--settle", type=float, default=2.0, help="a file must be unchanged this long before it is read")
    p.add_argument("--once", action="store_true", help="process what is there, then exit")
    return p.parse_args(argv)


def outputs_of(path):
    stem = os.path.splitext(path)[0]
    return stem + ".txt", stem + ".srt"


def is_done(path):
    """Both outputs exist and are at least as new as the audio."""
    mtime = os.path.getmtime(path)
    return all(os.path.exists(o) and os.path.getmtime(o) >= mtime for o in outputs_of(path))


def pending(folder, settle):
    now = time.time()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.lower().endswith(AUDIO_EXTENSIONS) or name.startswith(".") or not os.path.isfile(path):
            continue
        if now - os.path.getmtime(path) < settle or is_done(path):
            continue
        yield path


def write_atomically(path, text):
    """Write to a temporary name and rename, so a reader never sees half a file."""
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def process(model, path, language):
    start = time.perf_counter()
    result = model.transcribe(path, language=language, timestamps=True)
    txt, srt = outputs_of(path)
    write_atomically(srt, result.to_srt())
    write_atomically(txt, result.to_txt())
    took = time.perf_counter() - start
    print(f"{os.path.basename(path)}: {result.duration:.1f} s of audio in {took:.1f} s -> "
          f"{os.path.basename(txt)}, {os.path.basename(srt)}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    if not os.path.isdir(args.watch):
        raise tallow.Error(f"{args.watch}: no such folder to watch")
    device = pick_device(args.device)
    model = tallow.load_model(args.model, device=device)
    print(f"# watching {args.watch} with {args.model} on {device}", file=sys.stderr, flush=True)
    failed = {}
    while True:
        for path in pending(args.watch, args.settle):
            mtime = os.path.getmtime(path)
            if failed.get(path) == mtime:
                continue  # failed before and unchanged since: do not retry every poll
            try:
                process(model, path, args.language)
            except (tallow.Error, OSError) as e:  # one bad file must not stop the service
                failed[path] = mtime
                print(f"{os.path.basename(path)}: error: {e}", file=sys.stderr, flush=True)
        if args.once:
            break
        time.sleep(args.interval)
    rss = peak_rss_mb()
    if rss:
        print(f"# peak RSS {rss:.0f} MiB", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    run_main("transcribe_service", main)
