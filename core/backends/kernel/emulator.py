"""Test-only building blocks of the CPU emulators of kernel backends (tallow_cuda.cpu_driver,
tallow_metal.cpu_driver): compile a kernel source with g++ into a shared library (cached by
the hash of its files) and launch one of its kernels through ctypes. The fiber scheduler both
emulators run thread blocks on is cpu_fibers.h beside this file.

Standard library only; the emulators bring numpy themselves.
"""
import ctypes
import hashlib
import os
import subprocess
import tempfile

from tallow.errors import DeviceError, UnsupportedError

from .backend import DeviceStorage

HERE = os.path.dirname(os.path.abspath(__file__))
FIBERS = os.path.join(HERE, "cpu_fibers.h")  # found by `#include "cpu_fibers.h"`: HERE is on the include path


def cache_dir():
    return os.path.join(os.environ.get("TALLOW_CPU_EMULATOR_CACHE") or tempfile.gettempdir(), "tallow-cpu-emulator")


def compile_emulated(tag, deps, gxx, preprocess, unit, runtime, wrappers, includes=()):
    """Build (once per hash of `deps`) a shared library: `unit` + wrappers(preprocessed source),
    compiled with -include runtime and the include dirs `includes`. Returns its path."""
    h = hashlib.sha256()
    for p in list(deps) + [__file__]:
        with open(p, "rb") as f:
            h.update(f.read())
    os.makedirs(cache_dir(), exist_ok=True)
    lib = os.path.join(cache_dir(), f"{tag}-{h.hexdigest()[:16]}.so")
    if os.path.exists(lib):
        return lib
    include_flags = [flag for d in includes for flag in ("-I", d)]
    pre = subprocess.run([gxx, "-E", "-std=c++17", "-x", "c++", "-I", HERE] + include_flags + preprocess,
                         capture_output=True, text=True)
    if pre.returncode:
        raise DeviceError(f"cpu emulator: preprocessing {tag} failed:\n{pre.stderr[-3000:]}")
    tu = lib[:-3] + ".cpp"
    with open(tu, "w") as f:
        f.write(unit + wrappers(pre.stdout))
    tmp = f"{lib}.{os.getpid()}.tmp"
    proc = subprocess.run([gxx, "-O1", "-fwrapv", "-shared", "-fPIC", "-std=c++17", "-w", "-I", HERE] + include_flags
                          + ["-include", runtime, tu, "-o", tmp],
                          capture_output=True, text=True)
    if proc.returncode:
        raise DeviceError(f"cpu emulator: compiling {tag} failed:\n{proc.stderr[-3000:]}")
    os.replace(tmp, lib)
    return lib


def launch_emulated(lib, module, kernel, grid, block, args, pack, fibers):
    """Call tallow_launch_<kernel>: buffers by their address, everything else by the address of
    its packed bytes (the wrappers dereference scalars and take meta arrays as pointers)."""
    fn = getattr(lib, "tallow_launch_" + kernel, None)
    if fn is None:
        raise UnsupportedError(f"no kernel {kernel} in {module}")
    keep, ptrs = [], []
    for a in args:
        if isinstance(a, DeviceStorage):
            ptrs.append(a.buf.ctypes.data)
        else:
            raw = pack(a)
            b = ctypes.create_string_buffer(raw, max(8, len(raw)))
            keep.append(b)
            ptrs.append(ctypes.addressof(b))
    fn((ctypes.c_void_p * len(ptrs))(*ptrs), (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), int(fibers))


def source_file(tag, source, suffix):
    """A user's kernel source written once to the cache, named by its hash (compile_emulated reads files)."""
    os.makedirs(cache_dir(), exist_ok=True)
    path = os.path.join(cache_dir(), f"{tag}-{hashlib.sha256(source.encode()).hexdigest()[:16]}{suffix}")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    return path
