"""`tallow transcribe AUDIO`: speech to text with Whisper; a timing line on stderr.
On stdout, txt/srt/vtt segments are printed as each is decoded (long audio shows
progress at once); json, and --output files, are written when the whole is done.

Many inputs (files, globs, folders, --manifest), or --output-dir / --workers / --ray,
make it a batch (transcribe_batch.py): one output file per input in --output-dir."""
import os
import sys
import time

from .args import bounded_int, non_negative_float
from ..errors import Error
from ..io.atomic_output import atomic_output, check_output_path


def add_arguments(parser):
    parser.add_argument("audio", nargs="*",
                        help="audio file (WAV; other formats need ffmpeg on PATH); several files, "
                             "globs or folders make a batch (needs --output-dir)")
    parser.add_argument("--model", default="whisper-tiny.en",
                        help="a known model name (fetched on first use) or a Hugging Face-layout directory")
    parser.add_argument("--device", default=None, help="cpu, python, wgpu, ... (default: the best available)")
    parser.add_argument("--quantize", default=None, metavar="TYPE",
                        help="quantise the linear weights at load: q8_0 (int8 blocks, like faster-whisper's "
                             "int8; default: float weights)")
    parser.add_argument("--language", default=None, help="language code, e.g. en, de (default: detect)")
    parser.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    parser.add_argument("--timestamps", action="store_true",
                        help="decode with timestamp tokens: segments at the model's own timestamps "
                             "(always on for --format srt/vtt; otherwise one segment per 30 s window)")
    from ..models.whisper_decoding import MAX_BEAM_SIZE
    parser.add_argument("--beam-size", type=bounded_int(1, MAX_BEAM_SIZE, "beams: each decodes its own copy of "
                                                        "the text; 5 is the usual choice"),
                        default=None, help=f"beam search width, 1 to {MAX_BEAM_SIZE} (default: greedy; 5 is usual)")
    parser.add_argument("--temperature", type=non_negative_float, default=None,
                        help="a single sampling temperature (default: 0 with fallback 0.2 ... 1.0)")
    parser.add_argument("--format", default="txt", choices=("txt", "srt", "vtt", "json"))
    parser.add_argument("--output", "-o", default=None, help="write the transcript to this file instead of stdout")
    from .transcribe_batch import add_batch_arguments
    add_batch_arguments(parser)


def decoding_options(args):
    from ..models.whisper_transcribe import DEFAULT_TEMPERATURES
    return dict(language=args.language, task=args.task, beam_size=args.beam_size,
                timestamps=args.timestamps or args.format in ("srt", "vtt"),
                temperature=DEFAULT_TEMPERATURES if args.temperature is None else args.temperature)


def run(args):
    from ..models.whisper_quantize import check_choice
    from .transcribe_batch import is_batch, run_batch
    check_choice(args.quantize)  # before any model load: a typo should not cost one
    if is_batch(args):
        return run_batch(args, decoding_options(args))
    if not args.audio:
        raise Error("the following arguments are required: audio (a file; or several, a folder, "
                    "a glob or --manifest FILE, with --output-dir)")
    args.audio = args.audio[0]
    from ..models import whisper

    # Checked before the model loads: a typo should not cost a model load.
    if not os.path.isfile(args.audio):
        raise Error(f"{args.audio}: no such audio file" if not os.path.exists(args.audio)
                    else f"{args.audio}: is not a file")
    if args.output:
        check_output_path(args.output, sources=[args.audio])
    start = time.perf_counter()
    model = whisper.load(args.model, device=args.device, quantize=args.quantize)
    loaded = time.perf_counter()
    options = decoding_options(args)
    live = None if args.output or args.format == "json" else LiveTranscript(args.format, sys.stdout)
    result = model.transcribe(args.audio, on_segment=live and live.add, **options)
    done = time.perf_counter()
    if live is not None:
        live.close()
    elif args.output:
        text = result.format(args.format)
        try:
            with atomic_output(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as e:
            raise Error(f"{args.output}: cannot write the transcript: {e.strerror or e}") from None
    else:
        sys.stdout.write(result.format(args.format))
        sys.stdout.flush()
    wall = done - loaded
    rtf = wall / result.duration if result.duration else float("nan")
    print(f"{result.duration:.1f} s of audio ({result.language}) in {wall:.2f} s on {model.device}: "
          f"real-time factor {rtf:.3f} (model load {loaded - start:.2f} s)", file=sys.stderr)
    return 0


class LiveTranscript:
    """Writes segments as they come, in the same text TranscriptionResult.format gives."""

    def __init__(self, fmt, out):
        self.fmt, self.out, self.n = fmt, out, 0

    def add(self, seg):
        from ..models.whisper_transcribe import format_timestamp

        text = seg.text.strip()
        if not text:
            return
        if self.fmt == "vtt" and self.n == 0:
            self.out.write("WEBVTT\n")
        self.n += 1
        if self.fmt == "txt":
            self.out.write(text + "\n")
        elif self.fmt == "srt":
            self.out.write(f"{chr(10) if self.n > 1 else ''}{self.n}\n{format_timestamp(seg.start, True, ',')} --> "
                           f"{format_timestamp(seg.end, True, ',')}\n{text}\n")
        else:
            self.out.write(f"\n{format_timestamp(seg.start)} --> {format_timestamp(seg.end)}\n{text}\n")
        self.out.flush()

    def close(self):
        if self.fmt == "vtt" and self.n == 0:
            self.out.write("WEBVTT\n")
        self.out.flush()
