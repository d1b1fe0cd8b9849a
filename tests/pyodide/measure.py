"""Figures for the Pyodide path: boot time, `import tallow` time, and an n^3
matmul on the pure-Python backend inside Pyodide (Node) vs native CPython.

    python tests/pyodide/measure.py [n]      # n defaults to 64

Prints figures only; nothing here is a pass/fail threshold.
"""
import os
import sys
import tempfile
import time

MATMUL = '''
import time, tallow
dev = tallow.Device("python")
n = {n}
a = tallow.tensor([((i * 37) % 23 - 11) / 8 for i in range(n * n)], device=dev).reshape(n, n)
b = tallow.tensor([((i * 29) % 19 - 9) / 8 for i in range(n * n)], device=dev).reshape(n, n)
times = []
for _ in range({repeats}):
    started = time.perf_counter()
    c = a @ b
    times.append(time.perf_counter() - started)
{{"best_s": min(times), "sum": c.sum().item()}}
'''


def matmul_source(n, repeats=5):
    return MATMUL.format(n=n, repeats=repeats)


def run_native(source):
    """Evaluate a MATMUL-style source in this CPython (last line is the result expression)."""
    *body, last = source.strip().splitlines()
    namespace = {}
    exec("\n".join(body), namespace)
    return eval(last, namespace)


def main(n=64):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import node_runner

    missing = node_runner.missing_requirements()
    if missing:
        sys.exit(f"cannot measure: {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        wheel, _ = node_runner.build_wheel(tmp)
        print(f"wheel build:               {time.perf_counter() - started:6.2f} s  ({os.path.basename(wheel)})")
        with node_runner.PyodideRunner() as runner:
            print(f"Pyodide boot (in Node):    {runner.info['boot_s']:6.2f} s  (pyodide {runner.info['pyodide']})")
            started = time.perf_counter()
            runner.install_wheel(wheel)
            print(f"wheel install:             {time.perf_counter() - started:6.2f} s")
            imported = runner.run("import time\nt = time.perf_counter()\nimport tallow\ntime.perf_counter() - t")
            print(f"import tallow in Pyodide:  {imported:6.3f} s")
            inside = runner.run(matmul_source(n), timeout=300)
    native = run_native(matmul_source(n))
    assert abs(inside["sum"] - native["sum"]) <= 1e-3 * max(1.0, abs(native["sum"])), (inside, native)
    print(f"{n}^3 matmul, python backend, Pyodide/Node: {inside['best_s'] * 1e3:8.1f} ms")
    print(f"{n}^3 matmul, python backend, CPython {sys.version.split()[0]}: {native['best_s'] * 1e3:8.1f} ms")
    print(f"ratio Pyodide/native: {inside['best_s'] / native['best_s']:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
