"""The import graph of tallow's packages, read from the source (test_layers.py and
test_import_graph.py check it): every import statement counts, at module level and
inside functions."""
import ast
import os


def module_files(folders):
    """{dotted module name: file path} of every .py file under each {package: folder}."""
    found = {}
    for package, top in folders.items():
        top = os.fspath(top)
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            parts = [package] + [p for p in os.path.relpath(root, top).split(os.sep) if p != "."]
            for f in sorted(files):
                if f.endswith(".py"):
                    found[".".join(parts if f == "__init__.py" else parts + [f[:-3]])] = os.path.join(root, f)
    return found


def imports_of(module, path, known, via_packages=False):
    """The known modules `module` imports. `from pkg import sub` counts as pkg.sub when that is
    a module. via_packages: importing a.b.c also counts a.b (Python runs its __init__ first),
    unless `module` sits inside that package (a package's own modules run inside its import)."""
    is_package = path.endswith("__init__.py")
    here = module.split(".") if is_package else module.split(".")[:-1]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            targets.update(f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names)
    found = set()
    for target in targets:
        parts = target.split(".")
        for i in range(2 if via_packages else len(parts), len(parts) + 1):  # the root package is left out
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != module and (i == len(parts) or not module.startswith(prefix + ".")):
                found.add(prefix)
    return found


def import_graph(files, via_packages=False):
    """{module: set of modules it imports} over the modules in files ({name: path})."""
    return {m: imports_of(m, p, files, via_packages) for m, p in files.items()}


def cycles(graph):
    """The strongly connected components with more than one module, each sorted (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
