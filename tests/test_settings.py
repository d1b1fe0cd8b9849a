"""tallow.settings: every variable's default, valid values and bad values (one Error line
naming the variable and what it takes), the deprecated CPU switches, `tallow devices`
printing the settings through the entry point, and process tuning as an explicit call:
importing tallow changes no environment variable and calls no mallopt (child processes)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tallow.errors import Error
from tallow.settings import CPU_PATHS, VARIABLES, Settings, settings


def _clean_env(**extra):
    """os.environ without any variable tallow.settings reads, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(extra)
    return env


def test_defaults():
    s = Settings.from_env({})
    assert s.home == os.path.join(os.path.expanduser("~"), ".cache", "tallow")
    assert (s.device, s.cpu, s.threads) == (None, "auto", os.cpu_count() or 1)
    assert (s.quant_cache_mb, s.cpu_emulator_cache, s.wgpu_matmul, s.wgpu_max_binding_mb) == (None,) * 4
    assert (s.api_key, s.numba_jit, s.openblas_thread_timeout, s.warnings) == (None, True, None, ())
    assert {source for _, _, source in s.lines()} <= {"default", "default: one per core"}
    assert [name for name, _, _ in s.lines()] == [n for n in VARIABLES if n not in (
        "OMP_NUM_THREADS", "TALLOW_CPU_KERNELS", "TALLOW_NATIVE_KERNELS", "TALLOW_CPU_STEP_PROGRAM")]


@pytest.mark.parametrize("env, field, value", [
    ({"TALLOW_HOME": "/srv/models"}, "home", "/srv/models"),
    ({"TALLOW_DEVICE": "wgpu"}, "device", "wgpu"),
    *(({"TALLOW_CPU": path}, "cpu", path) for path in CPU_PATHS),
    ({"TALLOW_CPU": " Numba "}, "cpu", "numba"),
    ({"TALLOW_THREADS": "3"}, "threads", 3),
    ({"OMP_NUM_THREADS": "2"}, "threads", 2),
    ({"TALLOW_THREADS": "1", "OMP_NUM_THREADS": "4"}, "threads", 1),  # tallow's own wins
    ({"TALLOW_QUANT_CACHE_MB": "0"}, "quant_cache_mb", 0.0),
    ({"TALLOW_QUANT_CACHE_MB": "64.5"}, "quant_cache_mb", 64.5),
    ({"TALLOW_CPU_EMULATOR_CACHE": "/tmp/emu"}, "cpu_emulator_cache", "/tmp/emu"),
    *(({"TALLOW_WGPU_MATMUL": k}, "wgpu_matmul", k) for k in ("simple", "tiled", "tiled64", "tiled32")),
    ({"TALLOW_WGPU_MATMUL": "TILED32"}, "wgpu_matmul", "tiled32"),
    ({"TALLOW_WGPU_MAX_BINDING_MB": "0.0625"}, "wgpu_max_binding_mb", 0.0625),
    ({"TALLOW_API_KEY": "sk-secret"}, "api_key", "sk-secret"),
    ({"NUMBA_DISABLE_JIT": "1"}, "numba_jit", False),
    ({"NUMBA_DISABLE_JIT": "0"}, "numba_jit", True),
    ({"OPENBLAS_THREAD_TIMEOUT": "9"}, "openblas_thread_timeout", "9"),
])
def test_valid_values(env, field, value):
    s = Settings.from_env(env)
    assert getattr(s, field) == value
    shown = {name: source for name, _, source in s.lines()}
    assert any(source.startswith("environment") for source in shown.values())


@pytest.mark.parametrize("name, value, allowed", [
    ("TALLOW_CPU", "fast", "auto, numba, replay, numpy"),
    ("TALLOW_THREADS", "two", "positive whole number"),
    ("TALLOW_THREADS", "0", "positive whole number"),
    ("OMP_NUM_THREADS", "-1", "positive whole number"),
    ("TALLOW_QUANT_CACHE_MB", "lots", "a number of MB"),
    ("TALLOW_QUANT_CACHE_MB", "-5", "a number of MB"),
    ("TALLOW_QUANT_CACHE_MB", "inf", "a number of MB"),
    ("TALLOW_WGPU_MATMUL", "fastest", "simple, tiled, tiled64, tiled32"),
    ("TALLOW_WGPU_MAX_BINDING_MB", "0", "a positive number of MiB"),
    ("TALLOW_WGPU_MAX_BINDING_MB", "nan", "a positive number of MiB"),
    ("TALLOW_CPU_KERNELS", "off", "0 or 1"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_the_values(name, value, allowed):
    with pytest.raises(Error) as got:
        Settings.from_env({name: value})
    message = str(got.value)
    assert f"{name}={value!r}" in message and allowed in message and "\n" not in message


@pytest.mark.parametrize("old, path", [
    ({"TALLOW_CPU_KERNELS": "0"}, "numpy"),
    ({"TALLOW_NATIVE_KERNELS": "0"}, "numba"),
    ({"TALLOW_CPU_STEP_PROGRAM": "0"}, "replay"),
    ({"TALLOW_CPU_KERNELS": "1", "TALLOW_NATIVE_KERNELS": "1", "TALLOW_CPU_STEP_PROGRAM": "1"}, "auto"),
    ({"TALLOW_CPU_KERNELS": "0", "TALLOW_NATIVE_KERNELS": "0"}, "numpy"),  # no kernels: the rest is moot
    ({"TALLOW_NATIVE_KERNELS": "0", "TALLOW_CPU_STEP_PROGRAM": "0"}, "numba"),  # the dropped pair
])
def test_the_deprecated_cpu_switches_map_to_tallow_cpu(old, path):
    s = Settings.from_env(old)
    assert s.cpu == path
    assert s.sources["TALLOW_CPU"].startswith("environment: deprecated")
    assert len(s.warnings) == len(old)
    assert all("deprecated" in w and f"TALLOW_CPU={path}" in w for w in s.warnings)


def test_tallow_cpu_wins_over_the_deprecated_switches():
    s = Settings.from_env({"TALLOW_CPU": "numba", "TALLOW_CPU_KERNELS": "0"})
    assert (s.cpu, s.sources["TALLOW_CPU"]) == ("numba", "environment")
    assert s.warnings == ("TALLOW_CPU_KERNELS is deprecated and ignored: TALLOW_CPU=numba is set",)


def test_settings_are_parsed_again_only_when_a_variable_changes(monkeypatch, capsys):
    import tallow.settings
    monkeypatch.setattr(tallow.settings, "_warned", set())
    monkeypatch.setenv("TALLOW_THREADS", "3")
    first = settings()
    assert settings() is first and first.threads == 3
    monkeypatch.setenv("TALLOW_THREADS", "4")
    assert settings().threads == 4
    monkeypatch.delenv("TALLOW_CPU", raising=False)
    monkeypatch.setenv("TALLOW_NATIVE_KERNELS", "0")
    assert settings().cpu == "numba"
    monkeypatch.setenv("TALLOW_THREADS", "5")
    assert settings().cpu == "numba"  # parsed again: its warning is not repeated
    assert capsys.readouterr().err.splitlines() == [
        "tallow: warning: TALLOW_NATIVE_KERNELS=0 is deprecated: use TALLOW_CPU=numba"]


def test_the_api_key_is_never_shown():
    s = Settings.from_env({"TALLOW_API_KEY": "sk-secret"})
    assert "sk-secret" not in repr(s) and "sk-secret" not in str(s.lines())
    assert ("TALLOW_API_KEY", "set (not shown)", "environment") in s.lines()


# A child: import tallow, run a CPU op through the numpy backend, and report whether the
# environment changed and whether anything asked glibc for mallopt (ctypes.CDLL is watched).
IMPORT_PROBE = """
import ctypes, os, sys
asked = []
class Watched(ctypes.CDLL):
    def __getattr__(self, name):
        if name == "mallopt":
            asked.append(name)
        return super().__getattr__(name)
ctypes.CDLL = Watched
before = dict(os.environ)
import tallow
import tallow.backends.cpu.backend
import tallow.cli
tallow.tensor([1.0, 2.0], device="cpu").exp().numpy()
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(changed, asked)
if sys.argv[1:] == ["tune"]:
    tallow.settings.tune_process()
    tallow.settings.tune_process()  # once is enough
    print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), asked)
"""


def _python(code, *args, **env):
    return subprocess.run([sys.executable, "-c", code, *args], env=_clean_env(**env), capture_output=True,
                          text=True, timeout=300)


def test_importing_tallow_changes_no_environment_and_calls_no_mallopt():
    done = _python(IMPORT_PROBE, "tune")
    assert done.returncode == 0, done.stderr
    imported, tuned = done.stdout.splitlines()
    assert imported == "[] []"
    # numpy is loaded by now: too late for OpenBLAS's setting, so it is left alone
    assert tuned == ("None ['mallopt']" if sys.platform.startswith("linux") else "None []")


TUNE_PROBE = """
import os, sys
if sys.argv[1] == "numpy":
    import numpy
import tallow.settings
tallow.settings.tune_process()
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"))
"""


def test_tune_process_sets_openblas_timeout_before_numpy_and_the_users_value_wins():
    assert _python(TUNE_PROBE, "first").stdout.strip() == "4"
    assert _python(TUNE_PROBE, "first", OPENBLAS_THREAD_TIMEOUT="9").stdout.strip() == "9"
    assert _python(TUNE_PROBE, "numpy").stdout.strip() == "None"  # too late to matter: left alone


def test_the_cli_tunes_the_process_before_a_subcommand_runs():
    probe = "import os, tallow.cli; tallow.cli.main([]); print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    done = _python(probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "4"




@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc: Linux only")
def test_a_cli_process_keeps_the_malloc_policy():
    """What the import side effect gave every process, the CLI's main() still gives its own:
    freed blocks of 1 MB and more leave no resident pages (tests/test_mapped_pages.py)."""
    from freed_blocks import resident_after_freeing
    setup = ("import contextlib, io, tallow.cli\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    tallow.cli.main([])  # tunes the process as every subcommand gets it")
    assert resident_after_freeing(setup) < 1 << 20


def _tallow(*args, **env):
    script = Path(sys.executable).with_name("tallow")
    return subprocess.run([str(script), *args], env=_clean_env(**env), capture_output=True, text=True, timeout=300)


def _settings_lines(stdout):
    lines = stdout.splitlines()
    return {line.split()[0]: line.strip() for line in lines[lines.index("settings (tallow.settings):") + 1:]}


def test_tallow_devices_prints_the_settings_and_where_each_came_from(tmp_path):
    done = _tallow("devices", TALLOW_CPU="numba", TALLOW_HOME=str(tmp_path), OMP_NUM_THREADS="1",
                   TALLOW_API_KEY="sk-secret")
    assert (done.returncode, done.stderr) == (0, "")
    shown = _settings_lines(done.stdout)
    assert set(shown) == {name for name, _, _ in Settings.from_env({}).lines()}
    assert shown["TALLOW_CPU"].split() == ["TALLOW_CPU", "numba", "(environment)"]
    assert shown["TALLOW_HOME"].split() == ["TALLOW_HOME", str(tmp_path), "(environment)"]
    assert shown["TALLOW_THREADS"].split() == ["TALLOW_THREADS", "1", "(environment:", "$OMP_NUM_THREADS)"]
    assert shown["TALLOW_DEVICE"].endswith("(default)")
    assert shown["OPENBLAS_THREAD_TIMEOUT"].split() == ["OPENBLAS_THREAD_TIMEOUT", "4", "(default:", "set", "by",
                                                        "tune_process)"]
    assert "sk-secret" not in done.stdout
    assert "quant_kernels=numba's (TALLOW_CPU=numba" in done.stdout or "quant_kernels=none" in done.stdout


def test_tallow_devices_with_a_deprecated_switch_warns_once_and_a_bad_value_is_one_error_line(tmp_path):
    done = _tallow("devices", TALLOW_CPU_KERNELS="0", TALLOW_HOME=str(tmp_path))
    assert done.returncode == 0
    assert done.stderr.splitlines() == ["tallow: warning: TALLOW_CPU_KERNELS=0 is deprecated: use TALLOW_CPU=numpy"]
    assert _settings_lines(done.stdout)["TALLOW_CPU"].split()[:3] == ["TALLOW_CPU", "numpy", "(environment:"]
    bad = _tallow("devices", "--json", TALLOW_CPU="fast")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.splitlines() == ["tallow devices: error: TALLOW_CPU='fast' is not one of auto, numba, replay, numpy"]
