"""`tallow fetch NAME...`: download models and test data into $TALLOW_HOME and print their paths.

    tallow fetch --list                 # the known names
    tallow fetch --verify NAME          # sha256 of every file against the record made at fetch time
    tallow fetch --refresh NAME         # fetch again, replacing the cached copy when the new one is complete
"""
from .. import hub
from ..errors import Error


def add_arguments(parser):
    parser.add_argument("names", nargs="*", help="known names (see --list), local paths or Hugging Face repo ids")
    parser.add_argument("--list", action="store_true", help="list the known names and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--verify", action="store_true",
                      help="check the fetched files' sizes and sha256 against those recorded when they were fetched")
    what.add_argument("--refresh", action="store_true", help="fetch again even when cached")


def run(args):
    if args.list or not args.names:
        if args.verify or args.refresh:
            raise Error("--verify and --refresh need the names to act on (see `tallow fetch --list`)")
        for key, recipe in hub.KNOWN.items():
            print(f"{key:<24} {recipe.description}")
        return 0
    for name in args.names:
        if args.verify:
            if name not in hub.KNOWN:
                raise Error(f"--verify checks known names (see `tallow fetch --list`), not {name!r}")
            count = hub.verify(name)
            print(f"{name}: {count} files match their recorded size and sha256 ({hub.model_dir(name)})")
        else:
            print(hub.fetch(name, progress=not args.quiet, refresh=args.refresh))
    return 0
