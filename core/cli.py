"""The `tallow` command line. Subcommands live in their own modules and are
imported only when used, so `tallow --version` stays instant."""
import argparse
import importlib
import sys

from . import __version__

# name -> (module, help). Each module has `add_arguments(parser)` and `run(args)`.
SUBCOMMANDS = {
    "devices": ("tallow.cli_devices", "list the devices that work here, with their features"),
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
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    from .errors import Error
    try:
        return modules[args.command].run(args) or 0
    except Error as e:
        print(f"tallow {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
