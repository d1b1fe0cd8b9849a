"""The tensor core and the GPU packages (tallow_wgpu, tallow_cuda, tallow_metal) have no import
cycles: every import counts (module level and inside functions), and importing a submodule
counts as importing its package too (Python runs the package's __init__ first). Application
modules are exempt for now (see EXEMPT)."""
import fnmatch
import subprocess
import sys
from pathlib import Path

from import_graph import cycles, module_files
from import_graph import import_graph as graph_of

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
# The packages the check reads, {import name: folder} (pyproject's package-dir).
PACKAGES = {"tallow": CORE, "tallow_wgpu": ROOT / "wgpu_backend", "tallow_cuda": ROOT / "cuda_backend",
            "tallow_metal": ROOT / "metal_backend"}

# Modules left out of the check, as fnmatch patterns over dotted names: only the facade.
EXEMPT = [
    "tallow",  # the package __init__ re-exports everything
]


def import_graph(root, exempt=()):
    """The graph of the package at root (named tallow), or of {name: folder} packages, with
    imports counting their packages too."""
    known = module_files(root if isinstance(root, dict) else {"tallow": root})
    graph = graph_of(known, via_packages=True)
    checked = {m for m in known if not any(fnmatch.fnmatchcase(m, p) for p in exempt)}
    return {m: graph[m] & checked for m in sorted(checked)}


def test_tensor_core_has_no_import_cycles():
    graph = import_graph(CORE, EXEMPT)
    assert "tallow.tensor" in graph and "tallow.ops" in graph and "tallow.quant.formats" in graph
    assert "tallow.ops.elementwise" in graph["tallow.tensor"] or "tallow.ops" in graph["tallow.tensor"]
    assert cycles(graph) == []


def test_gpu_packages_have_no_import_cycles():
    graph = import_graph(PACKAGES, EXEMPT)
    assert {"tallow_wgpu.backend", "tallow_wgpu.tuning", "tallow_cuda.backend", "tallow_metal.backend"} <= set(graph)
    assert "tallow.backends.gpu_backend" in graph["tallow_wgpu.backend"]  # the packages are read together
    assert cycles(graph) == []
    # tuning.py races the backend's public kernels (passed in as the backend), never imports it.
    assert not {m for m in graph["tallow_wgpu.tuning"] if m.startswith("tallow_wgpu.") and m != "tallow_wgpu.wgsl"}



def _third_party_imports(path):
    """The top-level names of the absolute imports in the file at path (module level and inside functions)."""
    import ast
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_imports_run_down_from_the_cpu_backend_to_the_block_formats():
    # tallow.quant is the GGUF block formats and their codecs; the CPU device (tallow.backends.cpu)
    # builds on them, never the other way (issue 30 found quant -> backends -> quant loops).
    graph = import_graph(CORE, EXEMPT)
    assert "tallow.quant.formats" in graph and "tallow.backends.cpu.backend" in graph
    upward = {m: sorted(t for t in graph[m] if t.startswith("tallow.backends"))
              for m in graph if m == "tallow.quant" or m.startswith("tallow.quant.")}
    assert not {m: t for m, t in upward.items() if t}, upward
    # Inside the CPU package: backend -> runtime -> kernels, never back up.
    order = ["tallow.backends.cpu.kernels", "tallow.backends.cpu.runtime"]
    for low, high in zip(order, order[1:]):
        back = {m: sorted(t for t in graph[m] if t.startswith(high)) for m in graph if m.startswith(low)}
        assert not {m: t for m, t in back.items() if t}, back
    kernels = {m for m in graph if m.startswith("tallow.backends.cpu.kernels")}
    assert not {m: graph[m] for m in kernels if {t for t in graph[m] if t.startswith("tallow.backends")} - kernels
                - {"tallow.backends", "tallow.backends.cpu"}}


def test_only_the_kernel_builders_import_numba():
    # numba and llvmlite stay inside tallow.backends.cpu.kernels: everything else asks runtime/kernel_calls.py
    # (which finds numba without importing it), so a process with the machine code cached never imports numba.
    # The wasm device's build lowers the same kernel IR to wasm32, so its build modules are the exception
    # (they run in `make wasm`, never when kernels.wasm is loaded; program.py, the call-list format, and threads.py,
    # its cut into per-thread programs, stay out).
    files = module_files(PACKAGES)
    users = {m for m, path in files.items() if _third_party_imports(path) & {"numba", "llvmlite"}}
    assert "tallow.backends.cpu.kernels.int_dot" in users
    builders = {"tallow.backends.wasm.build", "tallow.backends.wasm.kernels_ir", "tallow.backends.wasm.decode_ir",
                "tallow.backends.wasm.program_ir", "tallow.backends.wasm.module_ir", "tallow.backends.wasm.device_ir",
                "tallow.backends.wasm.gemm_ir", "tallow.backends.wasm.elementwise_ir", "tallow.backends.wasm.threads_ir"}
    assert {m for m in users if not m.startswith("tallow.backends.cpu.kernels.")} - builders == set()
    assert not {"tallow.backends.wasm.native", "tallow.backends.wasm.program", "tallow.backends.wasm.threads"} & users

def test_the_check_finds_a_cycle_across_packages(tmp_path):
    # The cycle issue 30 found: backend -> tuning at module level, tuning -> backend in a function.
    core, gpu = tmp_path / "core", tmp_path / "gpu"
    core.mkdir()
    gpu.mkdir()
    (core / "__init__.py").write_text("")
    (core / "base.py").write_text("")
    (gpu / "__init__.py").write_text("")
    (gpu / "backend.py").write_text("from tallow.base import x\nfrom . import tuning\n")
    (gpu / "tuning.py").write_text("def runner():\n    from .backend import LIMIT\n")
    graph = import_graph({"tallow": core, "tallow_gpu": gpu})
    assert "tallow.base" in graph["tallow_gpu.backend"]
    assert cycles(graph) == [["tallow_gpu.backend", "tallow_gpu.tuning"]]


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "b.py").write_text("")
    (pkg / "sub" / "c.py").write_text("def f():\n    from ..a import x\n")
    # a -> sub.b runs sub/__init__, which imports c, whose function imports a.
    assert cycles(import_graph(pkg)) == [["tallow.a", "tallow.sub", "tallow.sub.c"]]


def test_import_tallow_stays_light():
    # Pyodide imports tallow without numpy; the GGUF block codecs (tallow.quant) load on first use.
    code = "import sys, tallow; print(sorted(m for m in ('numpy', 'torch', 'tallow.quant') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_shared_kernel_backend_stays_light():
    # tallow.backends.kernel is what CUDA and Metal build on: it must import on a box without
    # numpy, cupy or PyObjC (the drivers bring those), and without either GPU package.
    code = ("import sys; import tallow.backends.kernel.backend, tallow.backends.kernel.host, "
            "tallow.backends.kernel.emulator; print(sorted(m for m in ('numpy', 'cupy', 'Metal', 'tallow_cuda', "
            "'tallow_metal', 'tallow_wgpu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
