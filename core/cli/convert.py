"""`tallow convert SRC DST`: a CTranslate2 Whisper model (faster-whisper folder) into the
Hugging Face layout tallow loads (see tallow.convert)."""
import sys


def add_arguments(p):
    p.add_argument("src", metavar="SRC", help="a CTranslate2 Whisper folder (model.bin, config.json, tokenizer.json)")
    p.add_argument("dst", metavar="DST", help="the new Hugging Face-layout folder (must not exist yet)")
    p.add_argument("--quiet", action="store_true", help="print only the converted folder's path")


def run(args):
    from ..io.ctranslate2_convert import convert
    out = convert(args.src, args.dst, progress=not args.quiet)
    if not args.quiet:
        print(f"tallow: converted {args.src} -> {out}; load it with `tallow transcribe --model {out} AUDIO`",
              file=sys.stderr)
    print(out)
