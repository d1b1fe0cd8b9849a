"""pytest fixtures: one Pyodide (under Node) per session, with the tallow wheel installed.

    def test_something(pyodide_run):
        assert pyodide_run("import tallow\\ntallow.__version__") == "0.1.0"

Skips with the reason when node or the Pyodide runtime is missing here
(scripts/pyodide_setup.sh installs it); with TALLOW_REQUIRE_PYODIDE=1 (CI) the
same condition is a failure instead, so the suite cannot pass by skipping.
Import these names into a test module or conftest to use them.
"""
import importlib.util
import os
import time

import pytest


def _load_node_runner():
    # Loaded by path: tests/ is not a package, and "pyodide" is the name of Pyodide's own module.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_runner.py")
    spec = importlib.util.spec_from_file_location("tallow_tests_node_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node_runner = _load_node_runner()


@pytest.fixture(scope="session")
def pyodide_runner(tmp_path_factory):
    """A booted PyodideRunner with the freshly built tallow wheel installed (not mounted)."""
    missing = node_runner.missing_requirements()
    if missing:
        if os.environ.get("TALLOW_REQUIRE_PYODIDE") == "1":
            pytest.fail(f"TALLOW_REQUIRE_PYODIDE=1 but {missing}")
        pytest.skip(missing)
    started = time.perf_counter()
    wheel, source = node_runner.build_wheel(str(tmp_path_factory.mktemp("wheel")))
    wheel_s = time.perf_counter() - started
    runner = node_runner.PyodideRunner()
    try:
        runner.start()
        runner.install_wheel(wheel)
        runner.wheel_path, runner.wheel_source, runner.wheel_build_s = wheel, source, wheel_s
        yield runner
    finally:
        runner.close()


@pytest.fixture
def pyodide_run(pyodide_runner):
    """run(code, timeout=30) -> the JSON value of the code's last expression, evaluated in Pyodide."""
    return pyodide_runner.run
