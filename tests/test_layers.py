"""The architecture as a table: every module of tallow (and of the GPU backend packages)
sits in one layer, and a module only imports modules of its own layer or below.

    0  foundation    errors, settings, JSON and config-field reading: no tensors
    1  tensor core   dtypes, layout, devices, Tensor and its ops, autograd, quantised
                     blocks, and the backends that run them (tallow.backends, with
                     tallow.backends.kernel shared by CUDA and Metal; tallow_wgpu,
                     tallow_cuda, tallow_metal, which never import each other)
    2  io            weight files (GGUF, safetensors, npz, CTranslate2) <-> tensors
    3  blocks        nn layers, optimisers, audio features, tokenizers, and the hub
                     (model files on disk: known names, downloads, the cache)
    4  generation    sampling and decoding loops over any causal LM (no model class)
    5  models        Llama-family decoders, Whisper, load_model
    6  apps          built on the public API: transcribing many files over processes or Ray
                     (batch), the OpenAI-compatible HTTP server (serve)
    7  cli           the `tallow` command
    8  facade        `import tallow` (lazy tallow.load_model, tallow.hub, ...), examples

The hub sits below the models because load_model("smollm2-135m-instruct") fetches on
first use; generation sits below them because CausalLM.generate/stream/chat use it.
The graph counts imports inside functions too. Cycles inside the tensor core are
another test's business (test_import_graph.py); everywhere else there are none.
"""
import os

import pytest

import import_graph as graph_of
from import_graph import cycles, import_graph

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"tallow": "core", "tallow_wgpu": "wgpu_backend", "tallow_cuda": "cuda_backend",
            "tallow_metal": "metal_backend"}

FOUNDATION, TENSOR_CORE, IO, BLOCKS, GENERATION, MODELS, APPS, CLI, FACADE = range(9)

# Module (or package: it covers everything inside) -> layer. The longest matching name wins.
LAYERS = {
    "tallow.errors": FOUNDATION, "tallow.json_file": FOUNDATION, "tallow.config_fields": FOUNDATION,
    "tallow.version": FOUNDATION, "tallow.settings": FOUNDATION,

    "tallow.dtypes": TENSOR_CORE, "tallow.layout": TENSOR_CORE, "tallow.device": TENSOR_CORE,
    "tallow.tensor": TENSOR_CORE, "tallow.creation": TENSOR_CORE, "tallow.functional": TENSOR_CORE,
    "tallow.indexing": TENSOR_CORE, "tallow.index_check": TENSOR_CORE, "tallow.autograd": TENSOR_CORE,
    "tallow.grad_rules": TENSOR_CORE, "tallow.custom_op": TENSOR_CORE, "tallow.quant": TENSOR_CORE,
    "tallow.ops": TENSOR_CORE, "tallow.nested": TENSOR_CORE, "tallow.tensor_base": TENSOR_CORE, "tallow.step_capture": TENSOR_CORE,
    "tallow.backends": TENSOR_CORE, "tallow_wgpu": TENSOR_CORE, "tallow_cuda": TENSOR_CORE,
    "tallow_metal": TENSOR_CORE,

    "tallow.io": IO,

    "tallow.nn": BLOCKS, "tallow.optim": BLOCKS, "tallow.audio": BLOCKS, "tallow.tokenizer": BLOCKS,
    "tallow.hub": BLOCKS,

    "tallow.generation": GENERATION,
    "tallow.models": MODELS,
    "tallow.batch": APPS,
    "tallow.serve": APPS,
    "tallow.cli": CLI,

    "tallow": FACADE, "tallow.__main__": FACADE, "tallow.examples": FACADE,
}


def module_files(repo=REPO):
    """{dotted module name: file path} of every .py file in the packages."""
    return graph_of.module_files({package: os.path.join(repo, folder) for package, folder in PACKAGES.items()})


def entry_of(module):
    """The LAYERS name that places `module` (the longest that covers it), or None."""
    matches = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return max(matches, key=len) if matches else None


def layer_of(module):
    return LAYERS[entry_of(module)]


def upward_imports(graph):
    """(module, imported module) pairs where the import reaches a higher layer."""
    return sorted((m, t) for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))


@pytest.fixture(scope="module")
def graph():
    return import_graph(module_files())


def test_every_module_has_a_layer_and_every_entry_a_module(graph):
    # The facade's entry ("tallow") covers only tallow/__init__.py: a new module or
    # subpackage must be placed in the table by whoever adds it.
    unplaced = sorted(m for m in graph if entry_of(m) is None or (entry_of(m) == "tallow" and m != "tallow"))
    assert not unplaced, f"add these modules to LAYERS in {__file__}: {unplaced}"
    stale = sorted(name for name in LAYERS if name not in graph)
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_module_imports_a_higher_layer(graph):
    bad = [f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})" for m, t in upward_imports(graph)]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_server_uses_only_the_public_api(graph):
    # tallow.serve is an application: load_model, tallow.generation and the errors, as a user's
    # program would; never a model's or a backend's insides.
    public = {"tallow.errors", "tallow.models", "tallow.generation"}
    served = {m: t for m, t in graph.items() if m == "tallow.serve" or m.startswith("tallow.serve.")}
    assert "tallow.serve.app" in served
    bad = sorted(f"{m} imports {t}" for m, targets in served.items() for t in targets
                 if t not in public and not t.startswith("tallow.serve"))
    assert not bad, "tallow.serve reaches past the public API:\n" + "\n".join(bad)


def test_no_import_cycles_outside_the_tensor_core(graph):
    outside = [c for c in cycles(graph) if any(layer_of(m) != TENSOR_CORE for m in c)]
    assert not outside, f"import cycles: {outside}"


def test_the_checks_catch_an_upward_import_and_a_cycle(graph):
    # The same functions on a graph with one planted mistake of each kind.
    planted = {m: set(t) for m, t in graph.items()}
    planted["tallow.nn.layers"].add("tallow.cli")
    planted["tallow.cli"].add("tallow.nn.layers")
    assert ("tallow.nn.layers", "tallow.cli") in upward_imports(planted)
    assert any({"tallow.nn.layers", "tallow.cli"} <= set(c) for c in cycles(planted))


GPU_PACKAGES = ("tallow_wgpu", "tallow_cuda", "tallow_metal")


def cross_imports(graph):
    """(module, imported module) pairs where one GPU backend package imports another, or the
    tallow package imports a GPU backend package (it finds them by name in tallow.device)."""
    def package(m):
        return m.split(".")[0]
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if package(t) in GPU_PACKAGES and package(t) != package(m))


def test_gpu_backend_packages_do_not_import_each_other(graph):
    # CUDA and Metal share tallow.backends.kernel (KernelBackend, the host logic, the emulator
    # runtime); neither imports the other, so either can be read, packaged or changed alone.
    assert any(t.startswith("tallow.backends.kernel") for t in graph["tallow_metal.backend"])
    assert any(t.startswith("tallow.backends.kernel") for t in graph["tallow_cuda.backend"])
    bad = [f"{m} imports {t}" for m, t in cross_imports(graph)]
    assert not bad, "GPU backend packages must build on tallow.backends.kernel, not on each other:\n" + "\n".join(bad)


def test_the_cross_import_check_catches_metal_importing_cuda(graph):
    planted = {m: set(t) for m, t in graph.items()}
    planted["tallow_metal.cpu_driver"].add("tallow_cuda.cpu_driver")
    planted["tallow_cuda.driver"].add("tallow_metal.driver")
    assert cross_imports(planted) == [("tallow_cuda.driver", "tallow_metal.driver"),
                                      ("tallow_metal.cpu_driver", "tallow_cuda.cpu_driver")]


def test_function_level_imports_count(tmp_path):
    (tmp_path / "core" / "sub").mkdir(parents=True)
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "sub" / "__init__.py").write_text("def f():\n    from ..cli import main\n")
    (tmp_path / "core" / "cli.py").write_text("from .sub import f\n")
    found = import_graph({m: p for m, p in module_files(str(tmp_path)).items()})
    assert found["tallow.sub"] == {"tallow.cli"} and found["tallow.cli"] == {"tallow.sub"}
