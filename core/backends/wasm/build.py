"""Build kernels.wasm: kernels_ir.py's module lowered by llvmlite's LLVM to a wasm32 object
(SIMD128), linked by wasm-ld into a module that imports its memory (JS or wasmtime owns the
WebAssembly.Memory) and exports the kernels, `__heap_base` (the first free byte after the
module's 64 KiB stack) and nothing else.

    python -m tallow.backends.wasm.build [--out FILE]   # prints the path; builds only when needed

A second module, kernels_mt.wasm, is the same kernels for threads (docs/wasm.md "Threads"): built
with +atomics,+bulk-memory (threads_ir's barrier waits on the memory), linked with --shared-memory
and a 4 GiB --max-memory, so the page's workers can share one WebAssembly.Memory({shared: true}),
and exporting `__stack_pointer`, which each worker's instance sets to a stack of its own (every
instance of a shared-memory module starts with the same one; the GEMMs pack A on the stack).

The result is cached in $TALLOW_HOME/wasm_kernels/<key>.wasm, the key a hash of the kernel
sources (this package and cpu/kernels/*.py) and llvmlite's version, as machine_code.py keys the
native objects; `ship()` copies it next to this file (kernels.wasm: package data of the wheel, and
what `tallow web build` puts in the site), so users never need LLVM or a linker. Building needs
the `cpu` extra (numba, llvmlite) and wasm-ld (`apt-get install lld`, or PyPI's ziglang).
"""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from ...errors import Error
from ...settings import settings

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "kernels.wasm")  # git-ignored; package data of the wheel
SHIPPED_THREADED = os.path.join(HERE, "kernels_mt.wasm")  # the same kernels over a shared memory (threads)
STACK_BYTES = 65536
MAX_MEMORY = 1 << 32  # the threaded module's memory maximum (a shared memory must declare one): wasm32's 4 GiB
FEATURES = "+simd128"
FEATURES_THREADED = "+simd128,+atomics,+bulk-memory"


class ToolchainError(Error):
    """The .wasm cannot be built here: the message names what to install."""


def sources():
    """The files whose text decides the module's code."""
    return sorted(glob.glob(os.path.join(HERE, "*.py")) + glob.glob(os.path.join(HERE, "..", "cpu", "kernels", "*.py")))


def key(threaded=False):
    import llvmlite
    h = hashlib.blake2b(digest_size=10)
    h.update(llvmlite.__version__.encode() + (b" threaded" if threaded else b""))
    for path in sources():
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.hexdigest()


def linker():
    """The wasm-ld command: Debian's lld (wasm-ld, wasm-ld-14) or PyPI's ziglang; None if neither."""
    for name in ("wasm-ld", "wasm-ld-14", "wasm-ld-15", "wasm-ld-16", "wasm-ld-17", "wasm-ld-18", "wasm-ld-19"):
        path = shutil.which(name)
        if path:
            return [path]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ziglang", "wasm-ld"]


def compile_object(m, features=FEATURES):
    """The IR module -> wasm32 object bytes (SIMD128, -O3)."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    from .kernels_ir import TRIPLE
    tm = llvm.Target.from_triple(TRIPLE).create_target_machine(features=features, opt=3, reloc="static")
    mod = llvm.parse_assembly(str(m))
    mod.triple = TRIPLE
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    passes = llvm.create_pass_builder(tm, pto)
    passes.getModulePassManager().run(mod, passes)
    return tm.emit_object(mod)


def link(obj, exports, out, threaded=False):
    ld = linker()
    if ld is None:
        raise ToolchainError("building kernels.wasm needs wasm-ld: apt-get install lld (or pip install ziglang)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.o")
        with open(path, "wb") as f:
            f.write(obj)
        cmd = ld + [path, "-o", out, "--no-entry", "--import-memory", "--stack-first", "-z",
                    f"stack-size={STACK_BYTES}", "--export=__heap_base", "--strip-all", "-O2"]
        cmd += [f"--export={name}" for name in exports]
        if threaded:
            cmd += ["--shared-memory", f"--max-memory={MAX_MEMORY}", "--export=__stack_pointer"]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise ToolchainError(f"wasm-ld failed: {done.stderr.strip() or done.stdout.strip()}")


def build(force=False, threaded=False):
    """The path of the cached kernels.wasm (threaded: kernels_mt.wasm) for these sources, built first if
    missing."""
    out = os.path.join(settings().home, "wasm_kernels", f"{key(threaded)}{'-mt' if threaded else ''}.wasm")
    if os.path.exists(out) and not force:
        return out
    from .module_ir import exports, module
    m = module(threaded)
    obj = compile_object(m, FEATURES_THREADED if threaded else FEATURES)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    link(obj, exports(m), tmp, threaded)
    if os.path.exists(out):  # another process built the same sources meanwhile: keep its file
        os.remove(tmp)
    else:
        os.replace(tmp, out)  # atomic: a reader never sees half a module
    return out


def ship(path=SHIPPED, threaded_path=None):
    """Build (or reuse) kernels.wasm and kernels_mt.wasm and copy them to `path` (default: next to this
    file, the package data) and `threaded_path` (default: kernels_mt.wasm beside `path`). Returns `path`."""
    threaded_path = threaded_path or os.path.join(os.path.dirname(os.path.abspath(path)), "kernels_mt.wasm")
    for built, to in ((build(), path), (build(threaded=True), threaded_path)):
        if not (os.path.exists(to) and _same(built, to)):
            shutil.copyfile(built, to + ".tmp")
            os.replace(to + ".tmp", to)
    return path


def _same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m tallow.backends.wasm.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=SHIPPED, help="where to copy the module (default: %(default)s)")
    p.add_argument("--out-threaded", default=None,
                   help="where to copy kernels_mt.wasm (default: kernels_mt.wasm beside --out)")
    args = p.parse_args(argv)
    try:
        print(ship(args.out, args.out_threaded))
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
