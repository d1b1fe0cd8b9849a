"""Build kernels.wasm: kernels_ir.py's module lowered by llvmlite's LLVM to a wasm32 object
(SIMD128), linked by wasm-ld into a module that imports its memory (JS or wasmtime owns the
WebAssembly.Memory) and exports the kernels, `__heap_base` (the first free byte after the
module's 64 KiB stack) and nothing else.

    python -m tallow.backends.wasm.build [--out FILE]   # prints the path; builds only when needed

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
STACK_BYTES = 65536


class ToolchainError(Error):
    """The .wasm cannot be built here: the message names what to install."""


def sources():
    """The files whose text decides the module's code."""
    return sorted(glob.glob(os.path.join(HERE, "*.py")) + glob.glob(os.path.join(HERE, "..", "cpu", "kernels", "*.py")))


def key():
    import llvmlite
    h = hashlib.blake2b(digest_size=10)
    h.update(llvmlite.__version__.encode())
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


def compile_object(m):
    """The IR module -> wasm32 object bytes (SIMD128, -O3)."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    from .kernels_ir import TRIPLE
    tm = llvm.Target.from_triple(TRIPLE).create_target_machine(features="+simd128", opt=3, reloc="static")
    mod = llvm.parse_assembly(str(m))
    mod.triple = TRIPLE
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    passes = llvm.create_pass_builder(tm, pto)
    passes.getModulePassManager().run(mod, passes)
    return tm.emit_object(mod)


def link(obj, exports, out):
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
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise ToolchainError(f"wasm-ld failed: {done.stderr.strip() or done.stdout.strip()}")


def build(force=False):
    """The path of the cached kernels.wasm for these sources, built first if missing."""
    out = os.path.join(settings().home, "wasm_kernels", f"{key()}.wasm")
    if os.path.exists(out) and not force:
        return out
    from .module_ir import exports, module
    m = module()
    obj = compile_object(m)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    link(obj, exports(m), tmp)
    if os.path.exists(out):  # another process built the same sources meanwhile: keep its file
        os.remove(tmp)
    else:
        os.replace(tmp, out)  # atomic: a reader never sees half a module
    return out


def ship(path=SHIPPED):
    """Build (or reuse) kernels.wasm and copy it to `path` (default: next to this file, the package data)."""
    built = build()
    if not (os.path.exists(path) and _same(built, path)):
        shutil.copyfile(built, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def _same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m tallow.backends.wasm.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=SHIPPED, help="where to copy the module (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        print(ship(args.out))
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
