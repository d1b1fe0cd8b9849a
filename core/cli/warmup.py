"""`tallow warmup`: compile the CPU kernels for this machine now, so the first `tallow transcribe`
or `tallow generate` runs at full speed (`make setup` runs it).

A cold first run compiles them itself (about 30 s on a 2-core x86 box, saying so on stderr);
the cache is per user and per machine (backends/cpu/kernels/machine_code.py), so warm up as the user who
will run tallow, with the same $TALLOW_HOME and $NUMBA_CACHE_DIR."""
import importlib.util
import os
import time

from ..errors import Error
from ..settings import settings

EPILOG = ("The machine code goes to $TALLOW_HOME/cpu_kernels/ (default ~/.cache/tallow), keyed by the "
          "kernel sources, the numba and llvmlite versions and this CPU; numba's own cache of the kernels goes "
          "to $NUMBA_CACHE_DIR if set, else beside tallow's sources when writable, else ~/.cache/numba. Both "
          "are per user: run it as the user who runs tallow. Running it again compiles nothing; after an "
          "upgrade it compiles what changed.")


def add_arguments(parser):
    parser.epilog = EPILOG


def run(args):
    if settings().cpu == "numpy":
        print("CPU kernels: off (TALLOW_CPU=numpy): nothing to compile")
        return 0
    if importlib.util.find_spec("numba") is None:
        print("CPU kernels: numba is not installed, so the CPU device runs numpy and there is nothing to "
              "compile (pip install 'tallow[cpu]' for the kernels)")
        return 0
    from ..backends.cpu.kernels import machine_code
    if machine_code.jit_disabled():
        raise Error("NUMBA_DISABLE_JIT=1 is set: numba compiles nothing and the kernels run as Python; "
                    "unset it to warm up")
    folder = machine_code.cache_folder()
    try:  # (a cache that cannot be written would cost the whole compile before saying so)
        os.makedirs(folder, exist_ok=True)
        import tempfile
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise Error(f"{folder}: cannot write the kernel cache there ({e.strerror or e}); "
                    "set TALLOW_HOME to a folder you can write") from None
    start = time.perf_counter()
    compiled = machine_code.warm()
    seconds = time.perf_counter() - start
    failed = machine_code.errors()
    if failed:
        raise Error(f"{len(failed)} of {len(machine_code.ENTRIES)} CPU kernels did not compile or load "
                    f"({'; '.join(failed)}); numba's kernels will run those")
    total = len(machine_code.ENTRIES)
    if compiled:
        print(f"CPU kernels: {len(compiled)} of {total} compiled in {seconds:.1f} s, "
              f"cached in {machine_code.cache_folder()}")
        where = _numba_cache()
        if where:
            print(f"numba's cache of the kernels: {where}")
    else:
        print(f"CPU kernels: all {total} already compiled for this machine, in {machine_code.cache_folder()}")
    return 0


def _numba_cache():
    """The folder numba cached the kernels in (asked only after it compiled them: numba is loaded)."""
    from ..backends.cpu.kernels import machine_code
    try:
        return machine_code.numba_kernel("qmatmul_shared")._cache._cache_path  # (numba's locator's choice)
    except Exception:  # noqa: BLE001 -- private to numba: a detail of the report, never a failure
        return None
