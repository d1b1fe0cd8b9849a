"""`tallow devices`: what works here and why the rest does not, and the settings in force."""
import json

from ..device import default_device, devices, unavailable
from ..settings import settings


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args):
    rows = settings().lines()  # first: a bad setting is the one error line, before any device is probed
    found = devices()
    missing = unavailable()
    if args.json:
        print(json.dumps({"available": found, "unavailable": missing, "default": str(default_device()),
                          "settings": {name: {"value": value, "from": source} for name, value, source in rows}},
                         indent=2))
        return 0
    for name, feats in found.items():
        desc = ", ".join(f"{k}={v}" for k, v in feats.items())
        print(f"{name:7s} available    {desc}")
    for name, reason in missing.items():
        print(f"{name:7s} unavailable  {reason}")
    print(f"default: {default_device()}")
    print("settings (tallow.settings):")
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"  {name:{width}s}  {value}  ({source})")
    return 0
