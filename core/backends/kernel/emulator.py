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
from tallow.settings import settings

from ..driver_protocol import nbytes_of
from .backend import DeviceStorage

HERE = os.path.dirname(os.path.abspath(__file__))
FIBERS = os.path.join(HERE, "cpu_fibers.h")  # found by `#include "cpu_fibers.h"`: HERE is on the include path


def cache_dir():
    return os.path.join(settings().cpu_emulator_cache or tempfile.gettempdir(), "tallow-cpu-emulator")


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


class EmulatedDriver:
    """The driver protocol over numpy byte buffers and g++-compiled kernels: what the CUDA and
    Metal emulators share. A subclass names its language and kernel modules and supplies
    build_module(module, gxx), build_custom(source, gxx) (paths of shared libraries) and
    pack(arg) (an argument's bytes as its real driver passes it)."""
    name = language = ""
    has_f64 = atomic64 = False
    modules: tuple = ()
    fiber_modules: tuple = ()  # kernels with barriers or shuffles run as fibers
    can_replay = True          # a replay launches the recorded list again (recording.relaunch)

    def __init__(self):
        import concurrent.futures
        import shutil
        gxx = shutil.which("g++")
        if gxx is None:
            raise DeviceError(f"the {self.language} CPU emulator needs g++")
        import numpy
        self.np = numpy
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            paths = dict(zip(self.modules, pool.map(lambda m: self.build_module(m, gxx), self.modules)))
        self._libs = {m: ctypes.CDLL(p) for m, p in paths.items()}
        self._fiber_modules = set(self.fiber_modules)
        self._gxx = gxx
        self.launches = 0

    def build_module(self, module, gxx):
        raise NotImplementedError

    def build_custom(self, source, gxx):
        raise NotImplementedError

    def pack(self, arg):
        raise NotImplementedError

    def load_source(self, name, source):
        key = f"custom op {name} #{hashlib.sha256(source.encode()).hexdigest()[:12]}"
        if key not in self._libs:
            self._libs[key] = ctypes.CDLL(self.build_custom(source, self._gxx))
            self._fiber_modules.add(key)  # a user's kernel may use barriers
        return key

    def alloc(self, dtype, numel):
        return DeviceStorage(self.np.zeros(max(nbytes_of(dtype, numel), 8), self.np.uint8), dtype, numel)

    def upload(self, data, dtype):
        raw = bytes(data)
        buf = self.np.zeros(max(len(raw), 8), self.np.uint8)
        buf[:len(raw)] = self.np.frombuffer(raw, self.np.uint8)
        return DeviceStorage(buf, dtype, len(raw) if dtype.is_quantized else len(raw) // dtype.itemsize)

    def download(self, st, byte_offset, nbytes):
        return st.buf[byte_offset:byte_offset + nbytes].tobytes()

    def write(self, st, byte_offset, data):
        raw = self.np.frombuffer(bytes(data), self.np.uint8)
        st.buf[byte_offset:byte_offset + raw.size] = raw

    def record(self, entries):
        return entries

    def replay(self, entries):
        from .recording import relaunch
        relaunch(self, entries)

    def launch(self, module, kernel, grid, block, args):
        launch_emulated(self._libs[module], module, kernel, grid, block, args, self.pack,
                        module in self._fiber_modules)
        self.launches += 1
