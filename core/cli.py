"""The `tallow` command line. Subcommands live in their own modules and are
imported only when used, so `tallow --version` stays instant."""
import argparse
import importlib
import sys

from . import __version__

# name -> (module, help). A module has `add_arguments(parser)` and `run(args)`,
# or a `main(argv)` that parses its own arguments.
SUBCOMMANDS = {
    "devices": ("tallow.cli_devices", "list the devices that work here, with their features"),
    "fetch": ("tallow.hub", "download and convert models into the cache ($TALLOW_HOME)"),
    "transcribe": ("tallow.cli_transcribe", "speech to text with Whisper"),
    "generate": ("tallow.cli_generate", "generate text with a language model (streams tokens)"),
    "chat": ("tallow.cli_chat", "interactive chat with a language model"),
    "quantize": ("tallow.io.quantize", "quantise a safetensors/GGUF file into GGUF (q8_0, q4_0, q4_1, q4_k)"),
    "bench": ("tallow.cli_bench", "real-time factor (Whisper) and tokens/s (LLM) on this box"),
    "web": ("tallow.cli_web", "build and serve the in-browser demo (Pyodide + WebGPU)"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tallow", description="tallow: ML inference in the browser and on edge boxes")
    parser.add_argument("--version", action="version", version=f"tallow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    argv = sys.argv[1:] if argv is None else list(argv)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if argv and argv[0] == name:  # only import what is used
            module = importlib.import_module(module_name)
            if not hasattr(module, "add_arguments"):
                return _guarded(name, lambda: module.main(argv[1:]))
            modules[name] = module
            module.add_arguments(p)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    return _guarded(args.command, lambda: modules[args.command].run(args))


def _guarded(command, fn):
    """Run a subcommand; a tallow.Error becomes one readable line and exit status 2."""
    from .errors import Error
    try:
        return fn() or 0
    except Error as e:
        print(f"tallow {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
