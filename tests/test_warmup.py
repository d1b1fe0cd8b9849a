"""`tallow warmup` and the first run (issue 29 item 2): warmup fills the kernel caches so a later
process compiles nothing, and a process that must compile says so on stderr before it starts.

Every process here runs with $TALLOW_HOME and $NUMBA_CACHE_DIR in a temporary folder, so the
user's caches are neither read nor disturbed; "compiles nothing" is observed through the cache
files (unchanged) and through numba never being imported, not through time."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("numba")

from tallow.backends.cpu.kernels import machine_code  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not machine_code.enabled(), reason="TALLOW_CPU=numba or NUMBA_DISABLE_JIT=1")
NOTICE = "tallow: compiling the CPU kernels for this machine, once"


def _entry_point():
    script = Path(sys.executable).with_name("tallow")
    return str(script) if script.exists() else "tallow"


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TALLOW_CPU", "TALLOW_CPU_KERNELS", "TALLOW_NATIVE_KERNELS",
                                                             "TALLOW_CPU_STEP_PROGRAM", "TALLOW_DEVICE")}
    env.update(TALLOW_HOME=str(tmp_path / "home"), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    return env


def _tallow(env, *args):
    return subprocess.run([_entry_point(), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=900, cwd=str(REPO))


def _files(folder):
    """{path: (size, mtime)} of every file under folder."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(folder).rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A one-layer Q8_0 Qwen2-shaped GGUF with a vocabulary (random weights): a quantised model
    whose CPU run uses the kernels."""
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_synthetic_gguf.py"), "qwen2", "q8_0", str(path),
                    "--scale", "0.0625", "--layers", "1"], check=True, capture_output=True, timeout=300)
    return path


GENERATE = ("generate", "--raw", "--device", "cpu", "--max-tokens", "2")


@pytest.mark.slow
def test_a_cold_run_says_it_compiles_before_anything_else(tmp_path, tiny_gguf):
    """The notice is stderr's first line, given before the model loads, and a count follows as
    kernels are done (the process is stopped after the first one: the rest is the same work)."""
    proc = subprocess.Popen([_entry_point(), *GENERATE, "--model", str(tiny_gguf), "hello"], env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "CPU kernels compiled" in line or len(lines) > 20:
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert lines and lines[0].startswith(NOTICE), lines
    total = len(machine_code.ENTRIES)
    assert f"({total} kernels, about" in lines[0] and "`tallow warmup`" in lines[0]
    assert lines[1].strip() == f"tallow: 1/{total} CPU kernels compiled", lines


@pytest.mark.slow
def test_warmup_fills_the_caches_and_later_processes_compile_nothing(tmp_path, tiny_gguf):
    env = _env(tmp_path)
    total = len(machine_code.ENTRIES)
    first = _tallow(env, "warmup")
    assert first.returncode == 0, first.stderr
    assert first.stderr.startswith(NOTICE) and f"{total}/{total} CPU kernels compiled" in first.stderr
    assert f"CPU kernels: {total} of {total} compiled" in first.stdout
    [folder] = (tmp_path / "home" / "cpu_kernels").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.{ext}" for n in machine_code.ENTRIES
                                                              for ext in ("json", "o"))
    numba_files = _files(tmp_path / "numba")
    assert any(p.endswith(".nbi") for p in numba_files) and any(p.endswith(".nbc") for p in numba_files)
    cached = _files(tmp_path / "home") | numba_files

    again = _tallow(env, "warmup")  # compiles nothing and says nothing on stderr
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert again.stdout.startswith(f"CPU kernels: all {total} already compiled")

    load = subprocess.run([sys.executable, "-c", "import sys\nfrom tallow.backends.cpu.kernels import machine_code\nfrom tallow.backends.cpu.runtime import kernel_calls\n"
                           "kernel_calls.kernels()\n"
                           "print('numba' in sys.modules, machine_code.errors(), "
                           "all(machine_code.kernel(n).native for n in machine_code.ENTRIES))"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert (load.stdout.strip(), load.stderr) == ("False [] True", "")  # every kernel linked, numba never loaded

    run = _tallow(env, *GENERATE, "--model", tiny_gguf, "hello")  # a model run on the warm cache: silent about it
    assert run.returncode == 0, run.stderr
    assert "compiling" not in run.stderr and "CPU kernels" not in run.stderr, run.stderr
    assert _files(tmp_path / "home") | _files(tmp_path / "numba") == cached

    (folder / "gelu.json").unlink()  # a partial cache: only what is missing compiles, and the notice counts it
    part = _tallow(env, "warmup")
    assert part.returncode == 0, part.stderr
    assert "(1 kernels, about" in part.stderr and "1/1 CPU kernels compiled" in part.stderr
    assert "`tallow warmup`" not in part.stderr  # (warmup does not suggest itself)
    assert (folder / "gelu.json").exists()


LOAD_AHEAD = """
import sys
from tallow.backends.cpu.runtime import kernel_calls
for device in sys.argv[1:]:
    kernel_calls.load_ahead(device)
print("llvmlite" in sys.modules, "numba" in sys.modules)
"""


@pytest.mark.parametrize("devices, env", [
    (["python", "wgpu", "cuda"], {}),  # other devices: nothing loaded, nothing compiled, nothing said
    (["cpu"], {"TALLOW_CPU": "numpy"}),  # the kernels switched off
    (["cpu"], {"TALLOW_CPU": "numba"}),  # numba's own kernels, compiled on use
])
def test_load_ahead_touches_nothing_where_the_kernels_will_not_run(tmp_path, devices, env):
    """(The CPU with the kernels on compiles and links: the slow tests above.)"""
    done = subprocess.run([sys.executable, "-c", LOAD_AHEAD, *devices], env=dict(_env(tmp_path), **env),
                          capture_output=True, text=True, timeout=300)
    assert (done.stdout.split(), done.stderr) == (["False", "False"], "")
    assert not (tmp_path / "home").exists()


def test_warmup_without_the_jit_is_one_error_line(tmp_path):
    env = dict(_env(tmp_path), NUMBA_DISABLE_JIT="1")
    done = _tallow(env, "warmup")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tallow warmup: error: NUMBA_DISABLE_JIT=1 is set: numba compiles nothing and the kernels run as Python; "
        "unset it to warm up"]
    assert not (tmp_path / "home").exists()


def test_warmup_into_a_cache_it_cannot_write_is_one_error_line_before_any_compile(tmp_path):
    (tmp_path / "file").write_text("x")
    env = dict(_env(tmp_path), TALLOW_HOME=str(tmp_path / "file"))
    done = _tallow(env, "warmup")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # (no compile notice: nothing was compiled)
    assert line.startswith("tallow warmup: error: ") and "cannot write the kernel cache" in line
    assert "set TALLOW_HOME" in line
    assert not (tmp_path / "numba").exists()  # numba compiled nothing
