"""`tallow devices`: what works here and why the rest does not."""
import json

from ..device import default_device, devices, unavailable


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args):
    found = devices()
    missing = unavailable()
    if args.json:
        print(json.dumps({"available": found, "unavailable": missing, "default": str(default_device())}, indent=2))
        return 0
    for name, feats in found.items():
        desc = ", ".join(f"{k}={v}" for k, v in feats.items())
        print(f"{name:7s} available    {desc}")
    for name, reason in missing.items():
        print(f"{name:7s} unavailable  {reason}")
    print(f"default: {default_device()}")
    return 0
