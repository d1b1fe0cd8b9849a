"""tallow inside Pyodide (CPython 3.14 compiled to WebAssembly) under Node.

One Pyodide process serves the whole session (tests/pyodide/run.mjs); the
tallow wheel is built from this tree and installed into it, so packaging is
tested too. Results come back as JSON and are compared here with numpy.
Needs node and scripts/pyodide_setup.sh; skips without them (fails with
TALLOW_REQUIRE_PYODIDE=1).
"""
import importlib.util
import json
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_fixture_module():
    # By path and once per session: tests/ is not a package, and "pyodide" is Pyodide's own module name.
    name = "tallow_tests_pyodide_fixture"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "pyodide", "fixture.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


_fixture = _load_fixture_module()
node_runner = _fixture.node_runner
pyodide_runner = _fixture.pyodide_runner
pyodide_run = _fixture.pyodide_run
pytestmark = pytest.mark.pyodide


# ---- the runner itself -----------------------------------------------------
def test_boots_the_pinned_pyodide(pyodide_runner):
    with open(os.path.join(HERE, "pyodide", "package-lock.json")) as f:
        locked = json.load(f)["packages"]["node_modules/pyodide"]["version"]
    assert pyodide_runner.info["pyodide"] == locked
    assert pyodide_runner.info["python"].startswith("3.14")
    # boot_s is a report (tests/pyodide/measure.py prints it), not a bound: no test asserts wall-clock time


def test_numpy_is_absent_inside_pyodide(pyodide_run):
    # Proves that whatever tallow computes in these tests ran on pure Python.
    with pytest.raises(node_runner.PyodideCodeError, match="ModuleNotFoundError: No module named 'numpy'"):
        pyodide_run("import numpy")


def test_tallow_imports_from_the_installed_wheel(pyodide_run, pyodide_runner):
    import tallow

    found = pyodide_run("import sys, tallow\n[tallow.__file__, tallow.__version__, 'numpy' in sys.modules]")
    assert found[0] == "/lib/python3.14/site-packages/tallow/__init__.py"
    assert found[1] == tallow.__version__
    assert found[2] is False, "import tallow must not import numpy"
    assert os.path.basename(pyodide_runner.wheel_path).startswith(f"tallow-{tallow.__version__}-py3-none-any")


def test_every_packaged_module_is_in_the_wheel(pyodide_run, pyodide_runner):
    # The pyproject mapping (core/ -> tallow, wgpu_backend/ -> tallow_wgpu, ...) must ship
    # every module of the source the wheel was built from.
    expected = node_runner.python_modules(pyodide_runner.wheel_source)
    assert "tallow" in expected and "tallow.dtypes" in expected
    missing = pyodide_run(
        "import importlib.util\n"
        f"names = {expected!r}\n"
        "[n for n in names if importlib.util.find_spec(n) is None]"
    )
    assert missing == [], f"modules missing from the wheel: {missing}"


# Optional third-party packages (pyproject extras) that Pyodide here does not have.
OPTIONAL_IMPORTS = {"numpy", "wgpu", "cupy", "Metal", "objc", "Foundation", "jinja2", "torch", "transformers",
                    "safetensors", "gguf", "tokenizers", "scipy", "numba", "llvmlite",
                    "starlette", "uvicorn", "python_multipart"}  # the last three: `tallow serve`, native only
# Native-only modules that need numpy at import time although not named for it: the CPU device
# (tallow.backends.cpu: the numpy backend, its numba kernels -- Pyodide has no numba -- and its runtime).
NEEDS_NUMPY_PACKAGE = "tallow.backends.cpu"


def _needs_numpy(name):
    return "numpy" in name or name.startswith(NEEDS_NUMPY_PACKAGE + ".")


def test_every_module_imports_inside_pyodide(pyodide_run, pyodide_runner):
    # The browser has no numpy here: only modules named for numpy may need it at import time
    # (everything else imports numpy inside the functions that use it).
    names = [n for n in node_runner.python_modules(pyodide_runner.wheel_source) if not n.endswith("__main__")]
    failures = pyodide_run(
        "import importlib\n"
        "failures = {}\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        failures[name] = ['missing', (e.name or '').split('.')[0], str(e)]\n"
        "    except BaseException as e:\n"
        "        failures[name] = ['error', type(e).__name__, str(e)]\n"
        "failures"
    )
    wrong = {
        name: detail for name, (kind, missing, detail) in failures.items()
        if kind != "missing" or missing not in OPTIONAL_IMPORTS or (missing == "numpy" and not _needs_numpy(name))
    }
    assert not wrong, f"modules that do not import inside Pyodide: {wrong}"


def test_result_stdout_and_stderr_come_back(pyodide_runner):
    reply = pyodide_runner.call("import sys\nprint('out', 1)\nprint('err', file=sys.stderr)\n{'a': [1, 2.5, None, True]}")
    assert reply["ok"] is True
    assert reply["result"] == {"a": [1, 2.5, None, True]}
    assert reply["stdout"] == "out 1\n"
    assert reply["stderr"] == "err\n"


def test_non_finite_floats_survive_the_trip(pyodide_run):
    values = pyodide_run("[float('nan'), float('inf'), -float('inf'), 1e-45]")
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1e-45]


def test_errors_come_back_with_the_traceback(pyodide_run):
    code = "def inner(x):\n    raise ValueError(f'bad value {x}')\n\ninner(41 + 1)\n"
    with pytest.raises(node_runner.PyodideCodeError) as info:
        pyodide_run(code)
    text = info.value.traceback
    assert "ValueError: bad value 42" in text
    assert "raise ValueError(f'bad value {x}')" in text  # the source line, not just a line number
    assert "line 2, in inner" in text
    assert "harness" not in text and "_pyodide" not in text  # the runner's own frames are dropped


def test_syntax_errors_and_unserialisable_results_are_reported(pyodide_run):
    with pytest.raises(node_runner.PyodideCodeError, match="SyntaxError"):
        pyodide_run("1 +")
    with pytest.raises(node_runner.PyodideCodeError, match="not JSON-serialisable"):
        pyodide_run("object()")


def test_each_request_gets_a_fresh_namespace(pyodide_run):
    pyodide_run("leftover = 1")
    with pytest.raises(node_runner.PyodideCodeError, match="NameError"):
        pyodide_run("leftover")


def test_a_hung_call_is_killed_and_the_runner_recovers(pyodide_runner):
    boots = pyodide_runner.boots
    # An endless loop came back: the runner's 2 s timeout killed it (no wall-clock bound asserted here).
    with pytest.raises(node_runner.PyodideTimeout, match="took more than 2 s"):
        pyodide_runner.run("while True:\n    pass", timeout=2)
    # The next call boots a fresh Pyodide and reinstalls the wheel.
    assert pyodide_runner.run("import tallow\ntallow.__file__").startswith("/lib/python3.14/site-packages/")
    assert pyodide_runner.boots == boots + 1


def test_a_host_folder_can_be_mounted(pyodide_runner, tmp_path):
    (tmp_path / "mounted_probe.py").write_text("VALUE = [1, 2, 3]\n")
    assert pyodide_runner.mount(str(tmp_path), "/mnt/probe") == "/mnt/probe"
    assert pyodide_runner.run("import sys\nsys.path.insert(0, '/mnt/probe')\nimport mounted_probe\nmounted_probe.VALUE") == [1, 2, 3]


def test_a_missing_runtime_is_a_clear_error(tmp_path):
    if not node_runner.find_node():
        pytest.skip("node is not on PATH")
    runner = node_runner.PyodideRunner(pyodide_dir=str(tmp_path))
    with pytest.raises(node_runner.PyodideRunnerError, match="no Pyodide at .*pyodide_setup.sh"):
        runner.start()


# ---- the conformance op cases on the pure-Python backend, inside Pyodide, against numpy/torch ----
def _load_conformance(name):
    # By path, with tests/conformance on sys.path: cases.py and compare.py import each other by name.
    folder = os.path.join(HERE, "conformance")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


cases = _load_conformance("cases")
assert_matches = _load_conformance("compare").assert_matches


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_op_suite_on_the_python_backend_matches_the_reference(name, pyodide_run):
    np = pytest.importorskip("numpy")
    case = cases.CASES[name]
    if case.torch:
        pytest.importorskip("torch")
    got = pyodide_run(cases.source(name, "python"))  # the very file tests/conformance/cases.py, run inside Pyodide
    assert_matches(got, case.reference(np), f"{name} in Pyodide", *case.tolerance("python"))


def test_matmul_64_in_pyodide_matches_native(pyodide_runner, record_property):
    # Timing is reported (pytest -s, or the junit property), never asserted: see tests/pyodide/measure.py.
    measure = node_runner.load_sibling("measure")
    source = measure.matmul_source(64, repeats=3)
    inside = pyodide_runner.run(source, timeout=120)
    native = measure.run_native(source)
    assert inside["sum"] == pytest.approx(native["sum"], rel=1e-5)
    ratio = inside["best_s"] / native["best_s"]
    record_property("matmul64_pyodide_ms", round(inside["best_s"] * 1e3, 2))
    record_property("matmul64_native_ms", round(native["best_s"] * 1e3, 2))
    print(f"64^3 matmul on the python backend: Pyodide {inside['best_s'] * 1e3:.1f} ms, "
          f"native {native['best_s'] * 1e3:.1f} ms ({ratio:.2f}x); Pyodide boot {pyodide_runner.info['boot_s']:.2f} s")
