"""The CPU kernels as machine code that a process loads without importing numba.

numba compiles each entry (a kernel declared by an `@entry(...)` line in this package, codes.entry)
once, as a C-callable function (a `cfunc` around the kernel),
into an object file in $TALLOW_HOME/cpu_kernels/<key>/; every later process loads those files
with llvmlite's MCJIT and calls them through ctypes (which releases the GIL, as `nogil` did).
Why: loading numba's own cache cost a process numba's import (0.17 s) and the typing and
lowering registries its first cached load installs (0.25 s, 19 MB), before the first token;
llvmlite alone loads the objects in about 30 ms (measured on the 2-core x86 box). The key is
the kernel sources, numba's and llvmlite's versions and the host CPU's name and features, so
a change to any of them compiles again and a box never runs code built for another CPU.

An entry's array arguments travel as their address and shape ("f32[2]": a C-contiguous 2-D
float32 array), or address, extent, shape and byte strides ("f32[4A]": any 4-D view with
non-negative strides); the cfunc views them again (numba's carray / as_strided) and calls
the kernel, so the kernel code is the numba modules' own. A call whose arrays do not fit the
entry (another dtype, a non-contiguous view) runs the numba kernel instead. An entry declared
with step=True also gets a step form, <name>_step: a C function of one program row that a
captured step's run_step calls by address (step_loop.py, _step_cfunc below). Each object's
external symbols are checked before it is loaded (numba's C helpers, the CPython API, libc,
libm); an object that needs another one, or any failure here, leaves that kernel to numba.

TALLOW_CPU=numba turns this off (numba's own cache then loads every kernel); so does
NUMBA_DISABLE_JIT=1, under which the kernels run as Python.

Compiling all entries takes about half a minute, once per machine (and again after an upgrade
of tallow or numba changes the key): a process that must compile says so on stderr before it
starts, with a count as each entry is done (silence looked like a hang), and `tallow warmup`
(`warm()`) compiles them ahead, as `make setup` does. A warm process prints nothing.
"""
import glob
import json
import os
import sys
import threading
import time

from ....settings import settings

STEP = "_step"  # an entry's step form is the entry named <name>_step (result kind "step")


def _declared_entries():
    """{name: (module, kernel, argument kinds, result kind)} from the `@entry(...)` lines of this
    package's modules (codes.entry), read as text: nothing here imports numba. A step=True entry
    adds its step form, <name>_step. (About 1 ms: the files are small.)"""
    import ast
    import re
    found = {}
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "*.py"))):
        module = os.path.basename(path)[:-3]
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r"^@entry\(([^)]*)\)\n(?:@[^\n]*\n)*def (\w+)\(", text, re.M):
            call = ast.parse(f"entry({m.group(1)})", mode="eval").body
            kinds = tuple(ast.literal_eval(a) for a in call.args)
            options = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            name = options.get("name") or m.group(2)
            found[name] = (module, m.group(2), kinds, options.get("returns", "void"))
            if options.get("step"):
                found[name + STEP] = (module, m.group(2), kinds, "step")
    return found


ENTRIES = _declared_entries()
DTYPES = {"f32": "float32", "f64": "float64", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
          "u32": "uint32"}

# About what one entry takes to compile: the 14 took 29 s on the 2-core x86 box (0.1-9 s each, measured)
COMPILE_SECONDS = 2

_lock = threading.RLock()
_state: dict = {}  # "folder", "engine", "resolvable", "errors", "notice"; per entry name: its wrapper or None


def enabled():
    """False under TALLOW_CPU=numba or NUMBA_DISABLE_JIT=1 (numba's kernels, or their Python, run)."""
    return settings().cpu != "numba" and not jit_disabled()


def jit_disabled():
    """NUMBA_DISABLE_JIT=1 (read as numba reads it, without importing numba): the kernels run as Python."""
    return not settings().numba_jit


def kernel(name):
    """The entry `name` as a Python function with the numba kernel's arguments, or None (then use
    the numba kernel itself: this is off, or the entry could not be built or loaded)."""
    got = _state.get(name, False)
    if got is not False:
        return got
    with _lock:
        if name not in _state:
            _state[name] = _load_entry(name) if enabled() else None
        return _state[name]


def _digest(data=b""):
    """A BLAKE2b hash object from CPython's own `_blake2` (hashlib's import loads OpenSSL's libcrypto:
    +4 MB of every CPU process's RSS, measured), or hashlib's where that module is missing."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(data)


def load_all():
    """Link every entry now (kernel_calls.kernels() calls this once). Loading llvmlite (about 100 MB
    of its library's pages at dlopen) and each link touch LLVM's pages, handed back right after
    (llvm_pages.py) but counted in the peak RSS of that moment: linked one by one as first used,
    the decode step's entries came after the prompt had read the mapped weights. A
    Qwen2.5-0.5B-shaped Q4_K_M run peaked at 535 MB that way and at 527 MB with every entry
    linked at the start, where RSS is low (measured)."""
    for name in ENTRIES:
        kernel(name)
    _finish_notice()


def missing():
    """The entries whose machine code is not in the cache for this machine yet (what a first run
    would compile). Imports llvmlite (the key names the host CPU), not numba."""
    folder = _folder()
    return [name for name in ENTRIES if not os.path.exists(os.path.join(folder, name + ".json"))]


def warm():
    """Compile every entry missing from the cache and link them all, as a cold process's first
    use would, even where TALLOW_CPU=numba keeps this process on numba (`tallow warmup`).
    Returns the names it compiled; errors() says which failed. numba's own cache (cache=True, in
    $NUMBA_CACHE_DIR, else __pycache__ beside the kernel sources when writable, else the user's
    cache folder) gets the kernels it compiled on the way."""
    compiled = missing()
    with _lock:
        _state["ahead"] = True  # (the notice need not suggest `tallow warmup` to itself)
        for name in ENTRIES:
            if _state.get(name) is None:
                _state[name] = _load_entry(name)
    _finish_notice()
    return compiled


def cache_folder():
    """Where this machine's entries are cached: $TALLOW_HOME/cpu_kernels/<key>."""
    return _folder()


def numba_kernel(name):
    """The numba dispatcher behind entry `name` (imports numba)."""
    module, function, _args, _ret = ENTRIES[name]
    return getattr(numba_module(module), function)


def numba_module(module):
    """tallow.backends.cpu.kernels.<module>, one of the numba kernel modules (numba set up first: numba_setup.py)."""
    import importlib

    from . import numba_setup
    numba_setup.prepare()
    return importlib.import_module(f"{__package__}.{module}")


# ---- loading ----------------------------------------------------------------------------------

def _load_entry(name):
    try:
        folder = _folder()
        path = os.path.join(folder, name)
        if not os.path.exists(path + ".json"):
            _announce(folder)
            try:
                _compile(name, path)
            finally:
                _progress()
        with open(path + ".json") as f:
            manifest = json.load(f)
        with open(path + ".o", "rb") as f:
            code = f.read()
        if _digest(code).hexdigest() != manifest.get("blake2b"):  # (LLVM aborts on a broken object)
            raise ValueError(f"{path}.o is not the object its manifest describes (truncated or changed): "
                             "delete the folder to compile again")
        address = _link(name, code, manifest)
    except Exception as exc:  # noqa: BLE001 -- any failure leaves the kernel to numba, said once
        _state.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
        return None
    return StepForm(address) if ENTRIES[name][3] == "step" else _wrapper(name, address)


def _folder():
    if "folder" not in _state:
        import importlib.metadata
        import platform

        import llvmlite
        import llvmlite.binding as ll
        ll.initialize_native_target()
        ll.initialize_native_asmprinter()
        h = _digest()
        # every file of this package: the kernels' sources are exactly the modules here
        for path in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))):
            h.update(os.path.basename(path).encode())
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(json.dumps([importlib.metadata.version("numba"), llvmlite.__version__, sys.version_info[:2],
                             platform.machine(), ll.get_host_cpu_name(), ll.get_host_cpu_features().flatten(),
                             os.environ.get("NUMBA_CPU_NAME", ""), os.environ.get("NUMBA_CPU_FEATURES", "")]).encode())
        home = settings().home
        _state["folder"] = os.path.join(home, "cpu_kernels", h.hexdigest()[:20])  # as tallow.hub's cache root
    return _state["folder"]


def _engine():
    if "engine" not in _state:
        import llvmlite.binding as ll
        target = ll.Target.from_default_triple()
        machine = target.create_target_machine(cpu=ll.get_host_cpu_name(),
                                               features=ll.get_host_cpu_features().flatten(),
                                               codemodel="jitdefault", jit=True)
        _state["engine"] = ll.create_mcjit_compiler(ll.parse_assembly(""), machine)
        _state["resolvable"] = _register_symbols(ll)
    return _state["engine"], _state["resolvable"]


def _extension(name):
    """numba's C extension module `name` loaded from its file without numba's package (whose
    import is what this module avoids); it imports nothing of numba's Python."""
    if name in sys.modules:  # (numba is imported already)
        return sys.modules[name]
    import importlib.util
    *package, stem = name.split(".")
    root = importlib.util.find_spec("numba").submodule_search_locations[0]  # (finds, does not import)
    folder = os.path.join(root, *package[1:])
    paths = sorted(glob.glob(os.path.join(folder, stem + ".*.so")) + glob.glob(os.path.join(folder, stem + ".*.pyd")))
    if not paths:
        raise LookupError(f"numba's C extension {name} is missing from {folder}")
    spec = importlib.util.spec_from_file_location(name, paths[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _register_symbols(ll):
    """Give MCJIT the addresses numba's code links against, as numba itself does at start-up
    (numba.core.base._load_global_helpers, numba.core.runtime.nrt): its C helpers, its runtime's,
    and the builtin exception classes. Returns the names so registered."""
    import builtins
    names = set()
    for prefix, module in (("numba_", "numba._helperlib"), ("NRT_", "numba.core.runtime._nrt_python")):
        for py_name, address in _extension(module).c_helpers.items():
            ll.add_symbol(prefix + py_name, address)
            names.add(prefix + py_name)
    for obj in vars(builtins).values():
        if isinstance(obj, type) and issubclass(obj, BaseException):
            ll.add_symbol("PyExc_" + obj.__name__, id(obj))
            names.add("PyExc_" + obj.__name__)
    ll.add_symbol("_Py_NoneStruct", id(None))
    names.add("_Py_NoneStruct")
    return names


def _link(name, code, manifest):
    """Load one entry's object into the engine; its function's address."""
    import ctypes

    import llvmlite.binding as ll
    engine, resolvable = _engine()
    for symbol in manifest["external"]:  # (MCJIT aborts the process on a symbol it cannot resolve)
        if symbol not in resolvable and ll.address_of_symbol(symbol) is None:
            try:
                ll.add_symbol(symbol, ctypes.cast(getattr(ctypes.CDLL(None), symbol), ctypes.c_void_p).value)
            except AttributeError:
                raise LookupError(f"its machine code needs the symbol {symbol}, which this process lacks") from None
    engine.add_object_file(ll.ObjectFileRef.from_data(code))
    engine.finalize_object()
    address = engine.get_function_address(manifest["symbol"])
    if not address:
        raise LookupError(f"the object has no function {manifest['symbol']}")
    from . import llvm_pages
    llvm_pages.release()  # (LLVM's pages the link touched: not needed again)
    return address


# ---- compiling (once per key, with numba) --------------------------------------------------------

def _say(text, end="\n"):
    err = sys.stderr
    if err is not None:
        err.write(text + end)
        err.flush()


def _announce(folder):
    """Once per process, before the first compile (before numba's import): what is happening and
    for about how long. Counts what is missing now, so a run that finds half the cache compiles half."""
    if "notice" in _state and not _state["notice"]["finished"]:
        return
    todo = sum(not os.path.exists(os.path.join(folder, name + ".json")) for name in ENTRIES)
    tty = bool(getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())
    _state["notice"] = {"done": 0, "todo": todo, "start": time.perf_counter(), "tty": tty,
                        "finished": False}
    hint = "" if _state.get("ahead") else "; `tallow warmup` does this ahead"
    _say(f"tallow: compiling the CPU kernels for this machine, once ({todo} kernels, about "
         f"{COMPILE_SECONDS * todo} s{hint})...")
    if tty:
        _say(f"tallow: 0/{todo} CPU kernels compiled", end="")


def _progress():
    notice = _state["notice"]
    notice["done"] += 1
    line = f"tallow: {notice['done']}/{notice['todo']} CPU kernels compiled"
    if notice["tty"]:  # one line, rewritten
        _say("\r" + line, end="")
    else:
        _say(line)
    if notice["done"] >= notice["todo"]:
        _finish_notice()


def _finish_notice():
    notice = _state.get("notice")
    if notice is None or notice["finished"]:
        return
    notice["finished"] = True
    seconds = time.perf_counter() - notice["start"]
    _say(f"{chr(13) if notice['tty'] else ''}tallow: {notice['done']} CPU kernels compiled in {seconds:.1f} s, "
         f"cached in {_state['folder']}")


def _kinds(name):
    _module, _function, args, ret = ENTRIES[name]
    parsed = []
    for kind in args:
        if "[" in kind:
            dtype, dims = kind[:-1].split("[")
            parsed.append((dtype, int(dims.rstrip("A")), dims.endswith("A")))
        else:
            parsed.append((kind, None, False))
    return parsed, ret


def _compile(name, path):
    """numba compiles entry `name` as a cfunc; its object code and manifest go to path.o / path.json."""
    os.makedirs(os.path.dirname(path), exist_ok=True)  # (first: a cache that cannot be written fails before the work)
    import numpy as np

    scope = {"kernel": numba_kernel(name), "as_strided": np.lib.stride_tricks.as_strided}
    from numba import carray, cfunc, types
    scope["carray"] = carray
    kinds, ret = _kinds(name)
    scalar = {"i64": types.int64, "f64": types.float64, "f32": types.float32, "bool": types.boolean}
    params, views, signature = [], [], []
    for i, (dtype, ndim, strided) in enumerate(kinds):
        if ndim is None:
            params.append(f"a{i}")
            views.append(f"a{i}")
            signature.append(scalar[dtype])
            continue
        shape = [f"s{i}_{d}" for d in range(ndim)]
        tup = "(" + ", ".join(shape) + ",)"
        signature.append(types.CPointer(getattr(types, DTYPES[dtype])))
        if strided:
            strides = [f"t{i}_{d}" for d in range(ndim)]
            params += [f"p{i}", f"e{i}"] + shape + strides
            signature += [types.int64] * (1 + 2 * ndim)
            views.append(f"as_strided(carray(p{i}, (e{i},)), {tup}, ({', '.join(strides)},))")
        else:
            params += [f"p{i}"] + shape
            signature += [types.int64] * ndim
            views.append(f"carray(p{i}, {tup})")
    if ret == "step":
        compiled = _step_cfunc(name)
    else:
        source = f"def entry({', '.join(params)}):\n    return kernel({', '.join(views)})\n"
        exec(compile(source, f"<tallow native entry {name}>", "exec"), scope)  # noqa: S102 -- our own text
        result = {"void": types.void, "bool": types.boolean, "i64": types.int64}[ret]
        compiled = cfunc(result(*signature), nogil=True, error_model="numpy")(scope["entry"])
    library = compiled._library
    code = library._codegen._tm.emit_object(library._final_module)
    external = sorted(f.name for f in library._final_module.functions
                      if f.is_declaration and not f.name.startswith("llvm."))
    external += sorted(g.name for g in library._final_module.global_variables if g.is_declaration)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp + ".o", "wb") as f:
        f.write(code)
    os.replace(tmp + ".o", path + ".o")  # the object first: a manifest always has its object
    with open(tmp + ".json", "w") as f:
        json.dump({"symbol": compiled.native_name, "external": external,
                   "blake2b": _digest(code).hexdigest()}, f)
    os.replace(tmp + ".json", path + ".json")


def _step_cfunc(name):
    """numba's cfunc of the step form of entry `name` (<kernel>_step): a C function of one int64, the
    address of its program row, which holds the kernel's arguments from slot 2 on as step_args
    lays them out; run_step calls it by address (step_loop.py)."""
    import numpy as np
    from numba import carray, cfunc, types

    from . import step_loop
    from .codes import WIDTH
    kinds, _ret = _kinds(name)
    scope = {"kernel": numba_kernel(name), "carray": carray, "as_strided": np.lib.stride_tricks.as_strided,
             "bits": step_loop.float_bits, "np": np, "row_at": step_loop.POINTER_AT["i64"]}
    views, slot = [], 2
    for dtype, ndim, strided in kinds:
        if ndim is None:
            views.append({"f64": f"bits(p[{slot}])", "f32": f"np.float32(bits(p[{slot}]))", "bool": f"p[{slot}] != 0",
                          "i64": f"p[{slot}]"}[dtype])
            slot += 1
            continue
        scope[f"at_{dtype}"] = step_loop.POINTER_AT[dtype]
        shape = "(" + "".join(f"p[{slot + 1 + strided + d}], " for d in range(ndim)) + ")"
        if strided:
            strides = "(" + "".join(f"p[{slot + 2 + ndim + d}], " for d in range(ndim)) + ")"
            views.append(f"as_strided(carray(at_{dtype}(p[{slot}]), (p[{slot + 1}],)), {shape}, {strides})")
            slot += 2 + 2 * ndim
        else:
            views.append(f"carray(at_{dtype}(p[{slot}]), {shape})")
            slot += 1 + ndim
    source = f"def step_form(row):\n    p = carray(row_at(row), ({WIDTH},))\n    kernel({', '.join(views)})\n"
    exec(compile(source, f"<tallow step form {name}>", "exec"), scope)  # noqa: S102 -- our own text
    return cfunc(types.void(types.int64), nogil=True, error_model="numpy")(scope["step_form"])


class StepForm:
    """A loaded step form: the address run_step calls (see _step_cfunc)."""
    native = True

    def __init__(self, address, keep=None):
        self.address, self.keep = address, keep  # keep: numba's cfunc, alive while its code is called


def step_form(name):
    """The address of entry `name`'s step form, or None (no such form, or NUMBA_DISABLE_JIT=1).
    Machine code where it loads; else (TALLOW_CPU=numba, a failed load) numba compiles it in this
    process, once."""
    if name + STEP not in ENTRIES or jit_disabled():
        return None
    form = kernel(name + STEP)
    if form is None:
        with _lock:
            key = "in-process " + name
            if key not in _state:
                compiled = _step_cfunc(name + STEP)
                _state[key] = StepForm(compiled.address, compiled)
            form = _state[key]
    return form.address


def step_entry(fn):
    """The name of the entry with a step form that fn is (its machine code's wrapper, or the numba
    kernel itself), else None."""
    name = getattr(fn, "entry", None)
    py = getattr(fn, "py_func", None)
    if name is None and py is not None:
        name = _ENTRY_NAMES.get((py.__module__.rsplit(".", 1)[-1], py.__name__))
    return name if name is not None and name + STEP in ENTRIES else None


def step_args(name, args):
    """The ints of a step form's row for entry `name` called with args (from slot 2), or None when an
    array is not the kind the entry declares (another dtype or rank, not contiguous, a negative
    stride). Arrays travel as address and shape (strided kinds: address, extent, shape, byte
    strides), floats as their float64 bits, booleans as 0/1."""
    import numpy as np
    kinds, _ret = _kinds(name + STEP)
    out = []
    for (dtype, ndim, strided), a in zip(kinds, args):
        if ndim is None:
            out.append(int(np.float64(a).view(np.int64)) if dtype in ("f64", "f32") else int(a))
            continue
        if type(a) is not np.ndarray or a.dtype != np.dtype(DTYPES[dtype]) or a.ndim != ndim:
            return None
        if strided:
            if any(s < 0 for s in a.strides):
                return None
            out += _strided(a)
        elif not a.flags.c_contiguous:
            return None
        else:
            out += [a.__array_interface__["data"][0], *a.shape]
    return out


# ---- calling ---------------------------------------------------------------------------------

def _wrapper(name, address):
    """A Python function taking the kernel's own arguments that calls the machine code at address,
    or the numba kernel when an array does not fit."""
    import ctypes

    import numpy as np
    kinds, ret = _kinds(name)
    c_scalar = {"i64": ctypes.c_int64, "f64": ctypes.c_double, "f32": ctypes.c_float, "bool": ctypes.c_bool}
    py_scalar = {"i64": "int", "f64": "float", "f32": "float", "bool": "bool"}
    argtypes, args, checks = [], [], []
    scope = {"np": np, "ndarray": np.ndarray, "fallback": _Fallback(name)}
    for i, (dtype, ndim, strided) in enumerate(kinds):
        if ndim is None:
            argtypes.append(c_scalar[dtype])
            args.append(f"{py_scalar[dtype]}(a{i})")
            continue
        scope[f"D{i}"] = np.dtype(DTYPES[dtype])
        checks.append(f"type(a{i}) is not ndarray or a{i}.dtype != D{i} or a{i}.ndim != {ndim}")
        if strided:
            checks.append(f"any(s < 0 for s in a{i}.strides)")
            argtypes += [ctypes.c_void_p] + [ctypes.c_int64] * (1 + 2 * ndim)
            args.append(f"*strided(a{i})")
        else:
            checks.append(f"not a{i}.flags.c_contiguous")
            argtypes += [ctypes.c_void_p] + [ctypes.c_int64] * ndim
            args.append(f"a{i}.__array_interface__['data'][0], *a{i}.shape")
    restype = {"void": None, "bool": ctypes.c_bool, "i64": ctypes.c_int64}[ret]
    scope["fn"] = ctypes.CFUNCTYPE(restype, *argtypes)(address)
    scope["strided"] = _strided
    params = ", ".join(f"a{i}" for i in range(len(kinds)))
    source = (f"def {name}({params}):\n"
              f"    if {' or '.join(checks) or 'False'}:\n"
              f"        return fallback({params})\n"
              f"    return fn({', '.join(args)})\n")
    exec(compile(source, f"<tallow native call {name}>", "exec"), scope)  # noqa: S102 -- our own text
    call = scope[name]
    call.native = True  # (tests ask which path a kernel took)
    call.entry = name  # (step_program finds the entry behind a recorded call)
    return call


def _strided(a):
    """(address, extent in elements, *shape, *byte strides) of a view with non-negative strides."""
    extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize if a.size else 0
    return (a.__array_interface__["data"][0], extent, *a.shape, *a.strides)


class _Fallback:
    """The numba kernel of an entry, imported at the first call that needs it."""

    def __init__(self, name):
        self.name, self.fn = name, None

    def __call__(self, *args):
        if self.fn is None:
            self.fn = numba_kernel(self.name)
        return self.fn(*args)


def errors():
    """Why entries fell back to numba in this process (for `tallow devices` and tests)."""
    return list(_state.get("errors", ()))


class KernelModule:
    """One numba kernel module's names, as its callers use them: an entry's machine code where it
    loaded, else (and for every other name) the module's own attribute, imported on first use.
    constants: the names the callers read that need no numba (codes.py)."""

    def __init__(self, module, **constants):
        self._module = module
        self.__dict__.update(constants)

    def __getattr__(self, attr):  # (only for names not set yet)
        if attr.startswith("__"):
            raise AttributeError(attr)
        name = _ENTRY_NAMES.get((self._module, attr))
        fn = kernel(name) if name is not None else None
        if fn is None:
            fn = getattr(numba_module(self._module), attr)
        setattr(self, attr, fn)
        return fn


_ENTRY_NAMES = {(module, function): name for name, (module, function, _a, ret) in ENTRIES.items()
                if ret != "step"}
