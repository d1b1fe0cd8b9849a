"""What the benches that run each engine in a fresh process share: the child's memory readings
and running one child for the JSON line it prints last."""
import json
import subprocess


def _status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def peak_rss_bytes():
    """VmHWM, not ru_maxrss: Linux carries the parent's high-water mark into ru_maxrss across
    fork + exec, so a child of a big parent would report the parent's peak."""
    return _status_bytes("VmHWM")


def current_rss_bytes():
    return _status_bytes("VmRSS")


def run_child(cmd, env):
    """(the dict of the last JSON line cmd prints, None) or (None, why it gave none)."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return None, (done.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1]), None


def compile_tallow():
    """Byte-compile tallow's modules, as pip does when it installs the wheel: a checkout run with
    PYTHONDONTWRITEBYTECODE=1 (set on some boxes) compiles them from source in every child,
    about 0.08 s of a fresh process's time to its first token that no installed package pays
    (llama-cpp-python's and numpy's Python come byte-compiled by their install)."""
    import compileall
    import os

    import tallow
    compileall.compile_dir(os.path.dirname(tallow.__file__), quiet=1)
