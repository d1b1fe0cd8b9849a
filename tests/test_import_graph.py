"""The tensor core has no import cycles: every import counts (module level and inside
functions), and importing a submodule counts as importing its package too (Python runs
the package's __init__ first). Application modules are exempt for now (see EXEMPT)."""
import ast
import fnmatch
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"

# Modules left out of the check, as fnmatch patterns over dotted names: only the facade.
EXEMPT = [
    "tallow",  # the package __init__ re-exports everything
]


def modules(root, package="tallow"):
    """{dotted name: path} of the .py files under root, which is the package `package`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package] + parts)] = path
    return found


def imports_of(name, path, known):
    """The known modules that `name` imports anywhere in its source, with the packages they sit in
    (unless `name` sits in that package too: a package's own modules run inside its import)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            for a in node.names:  # `from . import ops` names a module, `from .ops import cat` a name in one
                targets.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
    found = set()
    for target in targets:
        parts = target.split(".")
        for i in range(2, len(parts) + 1):  # a.b.c also runs a.b's __init__ (the root package is left out)
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name and (i == len(parts) or not name.startswith(prefix + ".")):
                found.add(prefix)
    return found


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph(root, exempt=()):
    known = modules(root)
    checked = {m for m in known if not any(fnmatch.fnmatchcase(m, p) for p in exempt)}
    return {m: imports_of(m, known[m], known) & checked for m in sorted(checked)}


def test_tensor_core_has_no_import_cycles():
    graph = import_graph(CORE, EXEMPT)
    assert "tallow.tensor" in graph and "tallow.ops" in graph and "tallow.quant.formats" in graph
    assert "tallow.ops.elementwise" in graph["tallow.tensor"] or "tallow.ops" in graph["tallow.tensor"]
    assert cycles(graph) == []


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
