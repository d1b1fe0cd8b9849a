"""Training in the browser: the same seeded training run on WebGPU and on the pure-Python
backend inside Pyodide in Chromium gives the loss curve tallow gives natively on numpy."""
import importlib.util
import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("tallow_tests_browser_harness_training", os.path.join(HERE, "browser", "harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

pytestmark = pytest.mark.browser

# Synthetic data (scikit-learn's digits are not available inside Pyodide); the seed
# drives Python's own generator, so native and Pyodide draw the same numbers.
TRAIN = '''
import tallow
from tallow import functional as F
from tallow.nn import Linear, VarBuilder, VarMap
from tallow.optim import AdamW

def train(device, steps=8):
    tallow.manual_seed(0)
    x = tallow.randn(64, 8, device=device)
    y = (x @ tallow.randn(8, 3, device=device)).argmax(1)
    varmap = VarMap()
    vb = VarBuilder(varmap, device=device)
    l1, l2 = Linear(vb.pp("l1"), 8, 16), Linear(vb.pp("l2"), 16, 3)
    opt = AdamW(varmap.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(l2(l1(x).relu()), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
'''


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    harness.require_browser()
    out = str(tmp_path_factory.mktemp("web") / "dist")
    harness.build_test_site(out, models=False)
    with harness.DemoBrowser(out, artifacts=os.path.join(os.path.dirname(HERE), "test-artifacts", "browser")) as demo:
        yield demo, demo.open("?device=wgpu")  # the wgpu case needs the adapter even where it is a software one


@pytest.mark.parametrize("device", ["wgpu", "python"])
def test_training_in_the_browser_matches_native(page, device):
    demo, ui = page
    namespace = {}
    exec(TRAIN, namespace)
    native = namespace["train"]("cpu")
    assert native[-1] < native[0] * 0.7, native  # it does learn
    browser = demo.run(ui, TRAIN + f"\ntrain({device!r})", timeout_s=300)
    np.testing.assert_allclose(browser, native, rtol=1e-3)
