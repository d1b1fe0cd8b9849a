"""Shared by the edge scripts: device choice with clear errors, audio sources
(a WAV file in real-time-sized chunks, sounddevice, or arecord), and the
error-to-exit-code wrapper. Only tallow's public API is used."""
import os
import shutil
import subprocess
import sys
import time

import tallow

SAMPLE_RATE = 16000


class ScriptError(Exception):
    """A problem the user can fix (a missing device, package or file): printed as one line."""


def pick_device(name):
    """The named device, or the best one here (tallow.default_device()); a clear error if unavailable."""
    if not name:
        return tallow.default_device()
    try:
        return tallow.Device(name)
    except tallow.DeviceError as e:
        raise ScriptError(f"device {name!r} is not available here: {e}") from None


def run_main(prog, main):
    """Run main(); tallow errors and ScriptErrors become one line on stderr and exit status 2."""
    try:
        code = main()
    except (ScriptError, tallow.Error) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code or 0)


def peak_rss_mb():
    """Peak resident memory of this process in MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


# ---- audio sources: iterators of float sample chunks at 16 kHz mono ------------------------------
def wav_chunks(path, chunk_seconds, pace=False, max_seconds=None):
    """An audio file (any rate/channels; other formats through ffmpeg) cut into array('f')
    chunks as a microphone would deliver them, decoded as a stream so memory stays bounded;
    pace=True sleeps so that chunks arrive in real time."""
    if not os.path.exists(path):
        raise ScriptError(f"{path}: no such audio file")
    limit = int(max_seconds * SAMPLE_RATE) if max_seconds else None
    step = max(1, int(chunk_seconds * SAMPLE_RATE))
    start, sent = time.monotonic(), 0
    for chunk in _rechunk(tallow.audio.stream_audio(path, SAMPLE_RATE), step):
        if limit is not None:
            if sent >= limit:
                return
            chunk = chunk[:limit - sent]
        if pace:
            delay = start + (sent + len(chunk)) / SAMPLE_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield chunk
        sent += len(chunk)


def _rechunk(chunks, step):
    """array('f') chunks of exactly `step` samples (the last may be shorter)."""
    from array import array
    pending = array("f")
    for chunk in chunks:
        if isinstance(chunk, array):
            pending.extend(chunk)
        else:  # numpy float32
            pending.frombytes(chunk.astype("=f4").tobytes())
        while len(pending) >= step:
            yield pending[:step]
            del pending[:step]
    if pending:
        yield pending


def microphone_chunks(chunk_seconds, max_seconds=None):
    """Live microphone audio: sounddevice when installed, else ALSA's arecord; a clear error if neither."""
    try:
        import sounddevice  # noqa: F401
        source = _sounddevice_chunks(chunk_seconds)
    except ImportError:
        if shutil.which("arecord") is None:
            raise ScriptError("no microphone access: install sounddevice (pip install sounddevice) or ALSA's arecord "
                              "(apt install alsa-utils), or pass --wav FILE") from None
        source = _arecord_chunks(chunk_seconds)
    total = 0
    for chunk in source:
        yield chunk
        total += len(chunk)
        if max_seconds and total >= max_seconds * SAMPLE_RATE:
            return


def _sounddevice_chunks(chunk_seconds):
    import queue

    import sounddevice as sd
    q = queue.Queue()
    block = int(chunk_seconds * SAMPLE_RATE)

    def callback(indata, frames, time_info, status):
        q.put([float(v) for v in indata[:, 0]])

    with sd.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=block, callback=callback):
        while True:
            yield q.get()


def _arecord_chunks(chunk_seconds):
    from array import array
    block = int(chunk_seconds * SAMPLE_RATE)
    proc = subprocess.Popen(["arecord", "-q", "-f", "S16_LE", "-r", str(SAMPLE_RATE), "-c", "1", "-t", "raw"],
                            stdout=subprocess.PIPE)
    try:
        while True:
            raw = proc.stdout.read(2 * block)
            if not raw:
                err = proc.poll()
                if err:
                    raise ScriptError(f"arecord stopped with exit status {err} (is a microphone connected?)")
                return
            pcm = array("h")
            pcm.frombytes(raw[:len(raw) // 2 * 2])
            if sys.byteorder != "little":
                pcm.byteswap()
            yield [v / 32768.0 for v in pcm]
    finally:
        proc.terminate()


def audio_source(args):
    if args.wav:
        return wav_chunks(args.wav, args.chunk_seconds, pace=args.realtime, max_seconds=args.max_seconds)
    return microphone_chunks(args.chunk_seconds, max_seconds=args.max_seconds)


def add_audio_arguments(parser, chunk_default=1.0):
    parser.add_argument("--wav", help="read this audio file instead of the microphone (fed in chunks, like live audio)")
    parser.add_argument("--realtime", action="store_true", help="with --wav: deliver chunks at real-time pace")
    parser.add_argument("--chunk-seconds", type=float, default=chunk_default, help="audio chunk size (seconds)")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop after this much audio")
    parser.add_argument("--device", default=None, help="cpu, python, cuda, metal, wgpu (default: the best here)")
