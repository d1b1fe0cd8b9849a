"""`tallow gpu tune`: measure which matmul kernels suit this machine's WebGPU adapter.

Times the simple and the workgroup-tiled kernels of every matmul family (float f32/f16,
quantised prefill per in-kernel block format) on the wgpu adapter and caches the winners
in $TALLOW_HOME/wgpu_tuning.json, as the first use of each family would (tallow_wgpu.tuning).
`tallow gpu show` prints what is cached for this adapter."""
import json


def add_arguments(parser):
    parser.add_argument("action", choices=("tune", "show"), help="tune: measure now; show: print the cached choices")
    parser.add_argument("--family", action="append", metavar="NAME",
                        help='only this family, e.g. "matmul f32" or "qmatmul q4_1" (repeatable)')
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args):
    from ..device import Device
    from ..errors import Error

    backend = Device("wgpu").backend  # DeviceError (one line) where there is no adapter
    tuner = backend.tuning
    families = tuner.families()
    for name in args.family or ():
        if name not in families:
            raise Error(f"no matmul family {name!r} here; families: {', '.join(families)}")
    families = args.family or families
    if args.action == "show":
        records = {f: r for f in families if (r := tuner.cached(f)) is not None}
    else:
        records = {f: tuner.tune(f) for f in families}
    if args.json:
        print(json.dumps({"adapter": tuner.key, "cache": tuner.cache_file(), "families": records}, indent=1))
        return 0
    print(f"adapter: {tuner.key}")
    for family in families:
        rec = records.get(family)
        if rec is None:
            print(f"{family:14s} not measured yet (default: {tuner.default})")
            continue
        m, k, n = rec.get("shape") or (0, 0, 0)
        rates = ", ".join(f"{c} {2 * m * k * n / s / 1e9:.2f}" for c, s in rec.get("seconds", {}).items() if s > 0)
        print(f"{family:14s} -> {rec.get('choice')}   GFLOP/s at {m}x{k}x{n}: {rates or 'not timed'}")
    forced = tuner.forced()
    if forced:
        print(f"note: $TALLOW_WGPU_MATMUL={forced} overrides these choices while it is set")
    print(f"cache: {tuner.cache_file()}")
    return 0
