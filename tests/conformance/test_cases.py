"""The shared op cases (cases.py) on every device of the `device` fixture, against their
numpy/torch references; the same cases run inside Pyodide (test_pyodide.py) and Chromium
(test_browser.py)."""
import numpy as np
import pytest

import cases
from compare import assert_matches


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_case_matches_reference(device, name):
    case = cases.CASES[name]
    if case.torch:
        pytest.importorskip("torch")
    reason = case.not_applicable(device.type)
    if reason:  # a device without f64 (cases.NO_F64) refuses it with a clear error, never narrows silently
        assert "f64" in (cases.refusal(name, device) or ""), f"{name} on {device}: {reason}, yet it ran"
        return
    rtol, atol = case.tolerance(device.type)
    assert_matches(cases.run(name, device), case.reference(np), f"{name} on {device}", rtol, atol)


def test_source_is_this_module_and_runs_like_it():
    """What Pyodide and Chromium are sent evaluates, as a script, to what run() returns here."""
    import ast
    text = cases.source("matmul", "python")
    tree = ast.parse(text)
    last = tree.body.pop()
    namespace = {"__file__": cases.__file__}
    exec(compile(tree, "cases_source", "exec"), namespace)
    got = eval(compile(ast.Expression(last.value), "cases_source", "eval"), namespace)
    assert got == cases.run("matmul", "python")
    # the whole module travels: every case is defined there (18 when this was written)
    assert sorted(namespace["CASES"]) == sorted(cases.CASES) and len(cases.CASES) >= 18
