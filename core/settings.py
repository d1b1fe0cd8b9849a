"""Every setting tallow takes from the environment, read and checked in one place.

`settings()` is the Settings in force: the variables below, parsed and validated once
per distinct environment (tests and benchmarks change a variable at run time; the
parse is redone only then). A bad value is one Error line naming the variable and
the values it takes. `tallow devices` prints each setting and where it came from.

`tune_process()` is the process tuning that used to happen on import (OpenBLAS's
idle-thread timeout, glibc's malloc policy for large blocks). The CLI calls it
before any subcommand runs; a program embedding tallow calls it first thing, before
numpy is imported, to get the same CPU time and resident memory as `tallow`.

Layer 0 (foundation): imports nothing of tallow but errors.
"""
import dataclasses
import math
import os
import sys
from typing import Mapping, Optional

from .errors import Error

# TALLOW_CPU: which road the CPU device's quantised products take.
CPU_PATHS = {
    "auto": "the kernels on the GGUF blocks where numba is installed (as machine code tallow caches; "
            "a captured step runs as one program), else numpy",
    "numba": "the kernels through numba's own dispatch and cache (no machine code of tallow's own)",
    "replay": "the kernels, with a captured step replayed call by call instead of one program",
    "numpy": "no kernels: numpy on f32 copies of the weights",
}
# The three switches TALLOW_CPU replaces (one release, then removed): (name, value it takes when "0").
DEPRECATED_CPU = (("TALLOW_CPU_KERNELS", "numpy"), ("TALLOW_NATIVE_KERNELS", "numba"),
                  ("TALLOW_CPU_STEP_PROGRAM", "replay"))
WGPU_MATMULS = ("simple", "tiled", "tiled64", "tiled32")
OPENBLAS_THREAD_TIMEOUT = "4"  # see tune_process
MMAP_THRESHOLD = 1 << 20  # bytes from which glibc's malloc maps a block of its own (see tune_process)

# Every variable read here, in the order `tallow devices` prints them.
VARIABLES = ("TALLOW_HOME", "TALLOW_DEVICE", "TALLOW_CPU", "TALLOW_THREADS", "OMP_NUM_THREADS",
             "TALLOW_QUANT_CACHE_MB", "TALLOW_CPU_EMULATOR_CACHE", "TALLOW_WGPU_MATMUL",
             "TALLOW_WGPU_MAX_BINDING_MB", "TALLOW_API_KEY", "NUMBA_DISABLE_JIT", "OPENBLAS_THREAD_TIMEOUT",
             *(name for name, _ in DEPRECATED_CPU))


@dataclasses.dataclass(frozen=True)
class Settings:
    home: str  # the model and kernel cache
    device: Optional[str]  # the default device's name, None: the best one here (tallow.device)
    cpu: str  # one of CPU_PATHS
    threads: int  # the CPU kernels' threads
    quant_cache_mb: Optional[float]  # MB of f32 weight copies; None: the backend's own default
    cpu_emulator_cache: Optional[str]  # the CUDA/Metal CPU emulators' libraries; None: the temp dir
    wgpu_matmul: Optional[str]  # the WebGPU matmul kernel forced, None: chosen by measurement
    wgpu_max_binding_mb: Optional[float]  # a lower WebGPU binding limit, None: the adapter's
    api_key: Optional[str] = dataclasses.field(repr=False)  # `tallow serve`'s default key
    numba_jit: bool = True  # False under NUMBA_DISABLE_JIT=1: the kernels run as Python
    openblas_thread_timeout: Optional[str] = None  # as exported; tune_process sets the default
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    warnings: tuple = dataclasses.field(default=(), repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Settings":
        """Parse `env` (os.environ, or a dict in tests); raises Error for a bad value."""
        sources = {}
        warnings = []

        def get(name):
            value = env.get(name, "").strip()
            sources[name] = "environment" if value else "default"
            return value or None

        home = get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")
        cpu, cpu_source, cpu_warnings = _cpu_path(env)
        warnings += cpu_warnings
        threads_text, threads_var = get("TALLOW_THREADS"), "TALLOW_THREADS"
        if threads_text is None:
            threads_text, threads_var = get("OMP_NUM_THREADS"), "OMP_NUM_THREADS"
        threads = os.cpu_count() or 1
        if threads_text is not None:
            if not threads_text.isdigit() or int(threads_text) < 1:
                raise Error(f"{threads_var}={threads_text!r} is not a positive whole number of threads")
            threads = int(threads_text)
        matmul = get("TALLOW_WGPU_MATMUL")
        if matmul is not None:
            matmul = matmul.lower()
            if matmul not in WGPU_MATMULS:
                raise Error(f"$TALLOW_WGPU_MATMUL={env['TALLOW_WGPU_MATMUL']!r} names no matmul kernel: use "
                            f"{', '.join(WGPU_MATMULS)} (or unset it to choose by measurement)")
        jit_text = env.get("NUMBA_DISABLE_JIT", "0").strip()  # as numba reads it
        sources["NUMBA_DISABLE_JIT"] = "environment" if "NUMBA_DISABLE_JIT" in env else "default"
        return cls(home=home, device=get("TALLOW_DEVICE"), cpu=cpu, threads=threads,
                   quant_cache_mb=_megabytes(get("TALLOW_QUANT_CACHE_MB"), "TALLOW_QUANT_CACHE_MB",
                                             "a number of MB (0 keeps no f32 copies)", zero=True),
                   cpu_emulator_cache=get("TALLOW_CPU_EMULATOR_CACHE"), wgpu_matmul=matmul,
                   wgpu_max_binding_mb=_megabytes(get("TALLOW_WGPU_MAX_BINDING_MB"), "TALLOW_WGPU_MAX_BINDING_MB",
                                                  "a positive number of MiB (e.g. 0.0625 for 64 KiB)", zero=False),
                   api_key=get("TALLOW_API_KEY"), numba_jit=jit_text in ("", "0"),
                   openblas_thread_timeout=get("OPENBLAS_THREAD_TIMEOUT"),
                   sources={**sources, "TALLOW_CPU": cpu_source}, warnings=tuple(warnings))

    def lines(self):
        """(setting, value shown, where it came from): what `tallow devices` prints. The API key's
        value is never shown."""
        s = self.sources
        threads_from = next((f"environment: ${v}" for v in ("TALLOW_THREADS", "OMP_NUM_THREADS")
                             if s.get(v) == "environment"), "default: one per core")
        blas_from = s["OPENBLAS_THREAD_TIMEOUT"]
        if blas_from == "environment" and _cache.get("set_openblas") == self.openblas_thread_timeout:
            blas_from = "default: set by tune_process"
        return [
            ("TALLOW_HOME", self.home, s["TALLOW_HOME"]),
            ("TALLOW_DEVICE", self.device or "the best one here", s["TALLOW_DEVICE"]),
            ("TALLOW_CPU", self.cpu, s["TALLOW_CPU"]),
            ("TALLOW_THREADS", str(self.threads), threads_from),
            ("TALLOW_QUANT_CACHE_MB", "backend default" if self.quant_cache_mb is None else f"{self.quant_cache_mb:g}",
             s["TALLOW_QUANT_CACHE_MB"]),
            ("TALLOW_CPU_EMULATOR_CACHE", self.cpu_emulator_cache or "the temp folder", s["TALLOW_CPU_EMULATOR_CACHE"]),
            ("TALLOW_WGPU_MATMUL", self.wgpu_matmul or "chosen by measurement", s["TALLOW_WGPU_MATMUL"]),
            ("TALLOW_WGPU_MAX_BINDING_MB", "the adapter's" if self.wgpu_max_binding_mb is None
             else f"{self.wgpu_max_binding_mb:g}", s["TALLOW_WGPU_MAX_BINDING_MB"]),
            ("TALLOW_API_KEY", "set (not shown)" if self.api_key else "unset", s["TALLOW_API_KEY"]),
            ("NUMBA_DISABLE_JIT", "0" if self.numba_jit else "1", s["NUMBA_DISABLE_JIT"]),
            ("OPENBLAS_THREAD_TIMEOUT", self.openblas_thread_timeout or f"{OPENBLAS_THREAD_TIMEOUT} once tuned",
             blas_from),
        ]


def _megabytes(text, name, expected, zero):
    if text is None:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb) or mb < 0 or (mb == 0 and not zero):
        raise Error(f"{name}={text!r} is not {expected}")
    return mb


def _cpu_path(env):
    """TALLOW_CPU's value, where it came from, and the deprecation warnings of the old switches."""
    old = {name: env[name].strip() for name, _ in DEPRECATED_CPU if env.get(name, "").strip()}
    for name, value in old.items():
        if value not in ("0", "1"):
            raise Error(f"{name}={value!r} is not 0 or 1 (it is deprecated: use TALLOW_CPU={'|'.join(CPU_PATHS)})")
    text = env.get("TALLOW_CPU", "").strip().lower()
    if text:
        if text not in CPU_PATHS:
            raise Error(f"TALLOW_CPU={env['TALLOW_CPU']!r} is not one of {', '.join(CPU_PATHS)}")
        return text, "environment", tuple(f"{name} is deprecated and ignored: TALLOW_CPU={text} is set"
                                          for name in old)
    # The old three, first "0" wins: no kernels makes the other two moot, and numba's own
    # kernels with the step replayed call by call (both "0") is not kept: it runs as numba.
    chosen = next((path for name, path in DEPRECATED_CPU if old.get(name) == "0"), "auto")
    warnings = tuple(f"{name}={value} is deprecated: use TALLOW_CPU={chosen}" for name, value in old.items())
    source = "default" if not old else "environment: deprecated " + ", ".join(f"{n}={v}" for n, v in old.items())
    return chosen, source, warnings


_cache: dict = {}
_warned: set = set()
_WATCHED = (*VARIABLES, "HOME")  # HOME: TALLOW_HOME's default


def _environment_key() -> tuple:
    """The watched variables' raw values. Kernel calls ask settings() on every op, so this reads
    os.environ's own store (0.6 us) rather than 16 os.environ.get calls (13 us, measured)."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if data is None or encode is None:
        return tuple(map(os.environ.get, _WATCHED))
    if "encoded" not in _cache:
        _cache["encoded"] = tuple(map(encode, _WATCHED))
    return tuple(map(data.get, _cache["encoded"]))


def settings() -> Settings:
    """The Settings of os.environ now (parsed again only when one of VARIABLES changed). A
    deprecated variable's warning goes to stderr once per process."""
    key = _environment_key()
    got = _cache.get("key") == key and _cache.get("settings")
    if not got:
        got = Settings.from_env(os.environ)
        _cache.update(key=key, settings=got)
        for warning in got.warnings:
            if warning not in _warned:
                _warned.add(warning)
                print(f"tallow: warning: {warning}", file=sys.stderr)
    return got


def tune_process() -> None:
    """Tune this process for tallow's CPU work; call it before numpy is imported (the CLI does).

    OPENBLAS_THREAD_TIMEOUT=4 (where unset): after each product OpenBLAS's helper threads
    wait 2**4 polling cycles instead of 2**28 (about 0.1 s of a spinning core) before they
    sleep, so on a box that runs other work they do not take the cores the next op needs:
    a 2-thread Whisper tiny.en transcription of jfk.wav on a busy 2-core box used 1.17 s of CPU
    instead of 1.56-1.68 s. OpenBLAS reads it once, as numpy loads it: after that it is left alone.

    glibc's M_MMAP_THRESHOLD fixed at 1 MB: blocks from 1 MB get pages of their own, handed back
    when freed. glibc's default threshold grows to the largest block freed (up to 32 MB), after
    which a prompt's temporaries came from the heap and its high-water pages stayed resident:
    12 MB of a Qwen2.5-0.5B-class run's peak RSS. Idempotent."""
    if "numpy" not in sys.modules and not os.environ.get("OPENBLAS_THREAD_TIMEOUT"):
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = _cache["set_openblas"] = OPENBLAS_THREAD_TIMEOUT
    if _cache.get("tuned") or not sys.platform.startswith("linux"):
        return
    _cache["tuned"] = True
    try:
        import ctypes
        ctypes.CDLL(None).mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (also ends its growth)
    except (OSError, AttributeError):  # not glibc
        pass
