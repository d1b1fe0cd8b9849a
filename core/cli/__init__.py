"""The `tallow` command line. Subcommands live in their own modules and are
imported only when used, so `tallow --version` stays instant.

Every failure a user can cause ends the same way: one line on stderr,
`tallow COMMAND: error: WHAT (and what to do)`, and exit status 2."""
import argparse
import importlib
import sys

from ..version import __version__
from ..settings import tune_process

# name -> (module, help). A module has `add_arguments(parser)` and `run(args)`.
SUBCOMMANDS = {
    "devices": ("tallow.cli.devices", "list the devices that work here, with their features"),
    "fetch": ("tallow.cli.fetch", "download and convert models into the cache ($TALLOW_HOME)"),
    "transcribe": ("tallow.cli.transcribe", "speech to text with Whisper"),
    "generate": ("tallow.cli.generate", "generate text with a language model (streams tokens)"),
    "chat": ("tallow.cli.chat", "interactive chat with a language model"),
    "convert": ("tallow.cli.convert",
                "convert a CTranslate2 Whisper model (faster-whisper folder) to Hugging Face layout"),
    "quantize": ("tallow.cli.quantize", "quantise a safetensors/GGUF file into GGUF (q8_0, q4_0, q4_1, q4_k)"),
    "bench": ("tallow.cli.bench", "real-time factor (Whisper) and tokens/s (LLM) on this box"),
    "web": ("tallow.cli.web", "build and serve the in-browser demo (Pyodide + WebGPU)"),
    "gpu": ("tallow.cli.gpu", "measure which matmul kernels suit this WebGPU adapter (`tallow gpu tune`)"),
    "serve": ("tallow.cli.serve", "an OpenAI-compatible HTTP server (chat, completions, transcriptions)"),
    "warmup": ("tallow.cli.warmup", "compile the CPU kernels for this machine now (once, about 30 s), so the "
                                    "first transcribe or generate runs at full speed"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line (no usage block), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv=None):
    tune_process()  # first: OpenBLAS reads its setting as numpy loads (tallow.settings)
    parser = OneLineParser(prog="tallow", description="tallow: ML inference in the browser and on edge boxes")
    parser.add_argument("--version", action="version", version=f"tallow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # subparsers are OneLineParsers too
    modules = {}
    argv = sys.argv[1:] if argv is None else list(argv)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:  # only import what is used
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    return _guarded(args.command, lambda: modules[args.command].run(args))


def _guarded(command, fn):
    """Run a subcommand; a tallow.Error, or an OSError about a user's file, becomes one
    readable line and exit status 2."""
    from ..errors import Error
    try:
        return fn() or 0
    except Error as e:
        return _fail(command, str(e))
    except OSError as e:  # a missing input, a permission, a full disk: the message names the file
        where = f"{e.filename}: " if e.filename else ""
        return _fail(command, f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        return 130


def _fail(command, message):
    one_line = "; ".join(line.strip() for line in message.splitlines() if line.strip()) or "failed"
    print(f"tallow {command}: error: {one_line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
