"""Optimisers against torch.optim, the LR schedule, and the digits MLP end to end."""
import math

import numpy as np
import pytest

import tallow
from tallow.optim import SGD, Adam, AdamW, CosineWarmup

torch = pytest.importorskip("torch")


def _run(device, ours_cls, theirs_cls, kwargs, steps=5):
    rng = np.random.default_rng(0)
    w0, x = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    w = tallow.nn.Parameter(tallow.from_numpy(w0, device))
    tw = torch.from_numpy(w0.copy()).requires_grad_()
    opt, topt = ours_cls([w], **kwargs), theirs_cls([tw], **kwargs)
    xt, xtt = tallow.from_numpy(x, device), torch.from_numpy(x)
    for _ in range(steps):
        opt.zero_grad()
        topt.zero_grad()
        ((xt @ w).tanh().square().sum()).backward()
        ((xtt @ tw).tanh().square().sum()).backward()
        opt.step()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    return opt


@pytest.mark.parametrize("cls,tcls,kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (Adam, torch.optim.Adam, dict(lr=0.05, weight_decay=0.01)),
    (AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
])
def test_optimisers_match_torch(device, cls, tcls, kwargs):
    _run(device, cls, tcls, kwargs)


def test_optimiser_state_roundtrip(tmp_path):
    opt = _run("cpu", Adam, torch.optim.Adam, dict(lr=0.05))
    path = tmp_path / "opt.safetensors"
    opt.save(path)
    fresh = Adam([tallow.nn.Parameter(tallow.zeros(4, 3))], lr=1.0)
    fresh.load(path)
    assert fresh.steps == opt.steps and fresh.lr == pytest.approx(opt.lr)
    assert fresh.state.keys() == opt.state.keys()
    for k in opt.state:
        np.testing.assert_array_equal(fresh.state[k].numpy(), opt.state[k].numpy())


def test_cosine_warmup_schedule():
    p = tallow.nn.Parameter(tallow.zeros(2))
    opt = SGD([p], lr=1.0)
    sched = CosineWarmup(opt, warmup_steps=4, total_steps=14, min_lr=0.1)
    lrs = [opt.lr]
    for _ in range(14):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[9] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[14] == pytest.approx(0.1)


@pytest.mark.slow  # trains to an accuracy; one step per device stays fast
def test_digits_mlp_trains_saves_and_reloads(tmp_path):
    pytest.importorskip("sklearn")
    from tallow.examples.digits_mlp import MLP, accuracy, train
    model, varmap, losses, (xte, yte), _ = train("cpu", epochs=12, log=lambda *_: None)
    assert losses[-1] < losses[0] / 5
    acc = accuracy(model, xte, yte)
    assert acc >= 0.95, acc
    path = tmp_path / "mlp.safetensors"
    varmap.save(path)
    fresh = tallow.nn.VarMap()
    reloaded = MLP(tallow.nn.VarBuilder(fresh, device="cpu"))
    fresh.load(path)
    assert accuracy(reloaded, xte, yte) == acc


def test_training_step_matches_across_devices(device):
    """The same seeded training run gives the same loss curve on every device."""
    pytest.importorskip("sklearn")
    from tallow.examples.digits_mlp import train
    if device.type == "cpu":
        pytest.skip("cpu is the reference here")
    _, _, ref, _, _ = train("cpu", epochs=1, batch=256, log=lambda *_: None)
    _, _, got, _, _ = train(device.type, epochs=1, batch=256, log=lambda *_: None)
    np.testing.assert_allclose(got, ref, rtol=1e-3)
