"""The wgpu matmuls of more than one row: the workgroup-tiled kernels (matmul_tiled.wgsl,
qmatmul_tiled.wgsl) forced on through $TALLOW_WGPU_MATMUL, against torch and the gguf-checked
numpy dequantiser on lavapipe; and the choice between them and the simple kernels
(wgpu_backend/tuning.py) on the do-nothing driver with a fake clock, so it is deterministic.

The whole contract suite runs on the tiled kernels with
`TALLOW_WGPU_MATMUL=tiled pytest tests/conformance -k wgpu`."""
import json

import numpy as np
import pytest

import tallow
from tallow.errors import Error

torch = pytest.importorskip("torch")

CHOICES = ("tiled64", "tiled32", "simple")
IN_KERNEL_QUANTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


def record_labels(monkeypatch, dev):
    """The labels of the kernels the device's driver dispatches from now on (a list that grows)."""
    driver, labels = dev.backend.driver, []
    dispatch = driver.dispatch

    def spy(pipeline, *args):
        labels.append(pipeline[2])
        return dispatch(pipeline, *args)
    monkeypatch.setattr(driver, "dispatch", spy)
    return labels


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("choice", ("tiled64", "tiled32"))
@pytest.mark.parametrize("name", ("matmul", "conv1d"))
def test_contract_cases_on_the_tiled_kernels(wgpu, monkeypatch, choice, name):
    """The contract suite's cases that run matmuls of many rows (conv1d through im2col) with the
    tiled kernels forced on, against their numpy/torch references."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "conformance"))
    import cases
    from compare import assert_matches
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", choice)
    labels = record_labels(monkeypatch, wgpu)
    case = cases.CASES[name]
    rtol, atol = case.tolerance("wgpu")
    assert_matches(cases.run(name, wgpu), case.reference(np), f"{name} on the {choice} kernels", rtol, atol)
    assert f"matmul {choice}" in labels


# (m, k, n): edges on every side of a 64 and a 32 tile, K not a multiple of the K step
FLOAT_SHAPES = [(2, 3, 5), (70, 33, 130), (65, 64, 63), (129, 100, 31)]


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("m,k,n", FLOAT_SHAPES)
def test_float_matmul_layouts_match_torch(wgpu, monkeypatch, choice, m, k, n):
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", choice)
    labels = record_labels(monkeypatch, wgpu)
    a, b = rnd(m, k), rnd(k, n, seed=1)
    w = rnd(n, k, seed=2)  # a Linear weight: x @ w.T reads both operands' rows (vec4 loads where K % 4 == 0)
    at = rnd(k, m, seed=3)  # a transposed left operand: columns strided
    cases = {  # name -> (tallow result, left and right operands for torch)
        "plain": (tallow.from_numpy(a, device=wgpu) @ tallow.from_numpy(b, device=wgpu), a, b),
        "linear": (tallow.from_numpy(a, device=wgpu) @ tallow.from_numpy(w, device=wgpu).T, a, w.T),
        "transposed": (tallow.from_numpy(at, device=wgpu).T @ tallow.from_numpy(b, device=wgpu), at.T, b),
    }
    for name, (got, left, right) in cases.items():
        want = (torch.from_numpy(np.ascontiguousarray(left)) @ torch.from_numpy(np.ascontiguousarray(right))).numpy()
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{name} with {choice}")
    ran = [label for label in labels if label.startswith("matmul")]
    if choice == "simple":
        assert sorted(ran) == ["matmul", "matmul", "matmul" if k % 4 else "matmul_rows"]
    else:
        assert ran == [f"matmul {choice}"] * 3


@pytest.mark.parametrize("choice", ("tiled64", "tiled32"))
def test_batched_broadcast_and_offset_operands(wgpu, monkeypatch, choice):
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", choice)
    a, b = rnd(3, 2, 37, 20), rnd(2, 20, 45, seed=1)  # batch (3, 2) against a broadcast (2,) batch
    got = (tallow.from_numpy(a, device=wgpu) @ tallow.from_numpy(b, device=wgpu)).numpy()
    np.testing.assert_allclose(got, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy(), rtol=1e-4, atol=1e-4)
    # views that start mid-buffer (offset 1: not vec4-aligned) and attention's q @ k^T per head
    x = rnd(2, 4, 41, 16)
    xv = tallow.from_numpy(x, device=wgpu)
    q, kk = xv[:, :, 1:], xv[:, :, :-1]
    got = (q @ kk.transpose(-1, -2)).numpy()
    want = (torch.from_numpy(x[:, :, 1:]) @ torch.from_numpy(x[:, :, :-1]).transpose(-1, -2)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("choice", ("tiled64", "tiled32"))
def test_f16_operands(wgpu, monkeypatch, choice):
    """f16 storage (shader-f16 where the adapter has it), f32 accumulation, as the simple kernels."""
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", choice)
    a, w = rnd(70, 48).astype(np.float16), rnd(33, 48, seed=1).astype(np.float16)
    got = (tallow.from_numpy(a, device=wgpu) @ tallow.from_numpy(w, device=wgpu).T)
    assert got.dtype == tallow.f16
    want = (torch.from_numpy(a).float() @ torch.from_numpy(w).float().T).numpy()
    np.testing.assert_allclose(got.numpy().astype(np.float32), want, rtol=2e-3, atol=2e-2)


def quantised_blocks(qtype, n, k):
    """GGUF blocks of an (n, k) weight: tallow.quant's quantiser, or for Q6_K (none there) random
    blocks with a sane f16 scale."""
    from tallow.quant import quantize_numpy
    if qtype != "q6_k":
        return quantize_numpy(rnd(n, k, seed=5), qtype)
    blocks = np.random.default_rng(5).integers(0, 256, (n * k // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    return blocks


@pytest.mark.parametrize("choice", ("tiled64", "simple"))
@pytest.mark.parametrize("qtype", IN_KERNEL_QUANTS)
def test_quantised_prefill_matches_dequantised_product(wgpu, monkeypatch, choice, qtype):
    """m = 70 > QMATVEC_MAX_ROWS takes the prefill kernel; n = 40 leaves a partial column tile."""
    from tallow.quant import dequantize_numpy
    from tallow_wgpu.matmul import QMATVEC_MAX_ROWS
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", choice)
    labels = record_labels(monkeypatch, wgpu)
    m, n, k = QMATVEC_MAX_ROWS + 6, 40, 512
    blocks = quantised_blocks(qtype, n, k)
    x = rnd(m, k, seed=6)
    w = tallow.from_buffer(bytes(blocks), qtype, (n, k), device=wgpu)
    got = (tallow.from_numpy(x, device=wgpu) @ w.T).numpy()
    want = x.astype(np.float64) @ dequantize_numpy(blocks, qtype, n * k).reshape(n, k).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())
    assert labels.count(f"qmatmul {qtype}" if choice == "simple" else f"qmatmul tiled64 {qtype}") == 1


def test_quantised_prefill_f16_activations(wgpu, monkeypatch):
    from tallow.quant import dequantize_numpy
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", "tiled")
    blocks = quantised_blocks("q4_1", 24, 64)
    x = rnd(130, 64, seed=7).astype(np.float16)
    w = tallow.from_buffer(bytes(blocks), "q4_1", (24, 64), device=wgpu)
    got = (tallow.from_numpy(x, device=wgpu) @ w.T).numpy().astype(np.float32)
    want = x.astype(np.float32) @ dequantize_numpy(blocks, "q4_1", 24 * 64).reshape(24, 64).T
    np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-2)


# ---- the choice, on the do-nothing driver with a fake clock --------------------------------
class Clock:
    """A GPU whose every dispatch of a kernel label takes cost[label] seconds."""

    def __init__(self, driver, cost):
        self.driver, self.cost, self.now, self.seen = driver, cost, 0.0, {}

    def __call__(self):
        for label, count in self.driver.by_kernel.items():
            self.now += self.cost.get(label, 0.0) * (count - self.seen.get(label, 0))
        self.seen = dict(self.driver.by_kernel)
        return self.now


def null_backend(tmp_path, cost, measure=True):
    from tallow_wgpu import tuning
    from tallow_wgpu.backend import WgpuBackend
    from tallow_wgpu.driver_null import NullDriver
    driver = NullDriver()
    be = WgpuBackend(driver)
    be.tuning = tuning.Tuner(be, path=str(tmp_path / "tuning.json"), clock=Clock(driver, cost), measure=measure)
    return be, driver


COSTS_TILED_WINS = {"matmul_rows": 0.010, "matmul tiled64": 0.003, "matmul tiled32": 0.004,
                    "qmatmul q4_1": 0.004, "qmatmul tiled64 q4_1": 0.009}


def linear(be, m, k, n):
    from tallow import dtypes as D
    from tallow.backends.operand import Operand
    from tallow.layout import Layout
    a, w = be.from_bytes(bytes(4 * m * k), D.f32), be.from_bytes(bytes(4 * n * k), D.f32)
    return be.matmul(Operand(a, Layout((m, k))), Operand(w, Layout((k, n), (1, k))), D.f32)


def test_first_use_measures_picks_the_fastest_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    assert be.tuning.choice("matmul f32") == "tiled64"
    assert be.tuning.choice("qmatmul q4_1") == "simple"  # each family on its own measurement
    data = json.loads((tmp_path / "tuning.json").read_text())
    entry = data["adapters"][be.tuning.key]
    assert entry["matmul f32"]["choice"] == "tiled64" and entry["qmatmul q4_1"]["choice"] == "simple"
    assert entry["matmul f32"]["seconds"] == pytest.approx({"simple": 0.010, "tiled64": 0.003, "tiled32": 0.004})
    # a matmul of many rows now runs the winner; a fresh backend reads the cache and measures nothing
    be2, driver2 = null_backend(tmp_path, {})
    linear(be2, 100, 64, 48)
    assert driver2.by_kernel == {"matmul tiled64": 1}


def test_a_slow_candidate_is_dropped_after_one_run_and_short_runs_grow_the_shape(tmp_path, monkeypatch):
    from tallow_wgpu import tuning
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    be, driver = null_backend(tmp_path, {"matmul_rows": 0.0001, "matmul tiled64": 0.0009, "matmul tiled32": 0.00005})
    record = be.tuning.tune("matmul f32")
    assert record["choice"] == "tiled32" and record["shape"] == list(tuning.SHAPES[-1])
    assert "tiled64" not in record["seconds"]  # 9x the best so far after one timed run: not run again
    assert driver.by_kernel["matmul tiled64"] == 2 * len(tuning.SHAPES)  # a compile run and one timed run


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 1, "adapters": {"K": 3}}',
                                     '{"version": 99, "adapters": {}}', "\x00\xff"])
def test_a_corrupt_or_foreign_cache_is_measured_again(tmp_path, monkeypatch, content):
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    (tmp_path / "tuning.json").write_text(content, encoding="latin-1")
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    assert be.tuning.choice("matmul f32") == "tiled64"
    assert json.loads((tmp_path / "tuning.json").read_text())["version"] == 1


def test_an_unknown_cached_kernel_is_measured_again_and_an_unwritable_cache_costs_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    bad = {"version": 1, "adapters": {be.tuning.key: {"matmul f32": {"choice": "warp9"}}}}
    (tmp_path / "tuning.json").write_text(json.dumps(bad))
    assert be.tuning.choice("matmul f32") == "tiled64"
    (tmp_path / "dir").mkdir()
    be.tuning.path = str(tmp_path / "dir")  # a folder: cannot be read or written as the cache
    assert be.tuning.tune("qmatmul q4_1")["choice"] == "simple"


def test_the_environment_forces_a_kernel_and_a_bad_value_says_what_to_use(tmp_path, monkeypatch):
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", "simple")
    linear(be, 100, 64, 48)
    assert driver.by_kernel == {"matmul_rows": 1}  # nothing measured
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", "tiled32")
    assert be.tuning.choice("qmatmul q4_0") == "tiled64"  # the only tiled quantised kernel
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", "fastest")
    with pytest.raises(Error, match="TALLOW_WGPU_MATMUL.*simple, tiled"):
        be.tuning.choice("matmul f32")
    assert not (tmp_path / "tuning.json").exists()


def test_nothing_is_measured_inside_a_capture_or_where_first_use_measuring_is_off(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    be.begin_capture(0, 1)
    try:
        assert be.tuning.choice("matmul f32") == "tiled64"  # the default on a GPU that is not emulated
        assert driver.dispatches == 0
    finally:
        be.end_capture()
    assert be.tuning.choice("matmul f32") == "tiled64" and driver.dispatches > 0  # measured once allowed
    assert "matmul f32" in json.loads((tmp_path / "tuning.json").read_text())["adapters"][be.tuning.key]
    (tmp_path / "tuning.json").unlink()
    be2, driver2 = null_backend(tmp_path, COSTS_TILED_WINS, measure=None)  # the null driver never measures itself
    be2.driver.cpu_emulated = True
    from tallow_wgpu import tuning
    be2.tuning = tuning.Tuner(be2, path=str(tmp_path / "tuning.json"))
    linear(be2, 100, 64, 48)
    assert driver2.by_kernel == {"matmul_rows": 1}  # CPU-emulated: the simple kernel, unmeasured
    assert not (tmp_path / "tuning.json").exists()


def test_operands_larger_than_a_binding_are_not_measured(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS)
    be.limits["max_storage_binding"] = 4096  # as $TALLOW_WGPU_MAX_BINDING_MB lowers it
    record = be.tuning.tune("qmatmul q8_0")
    assert record == {"choice": "tiled64", "seconds": {}, "shape": None} and driver.dispatches == 0
    assert not (tmp_path / "tuning.json").exists()


def test_cli_tune_measures_and_caches_then_show_reads_it(wgpu, tmp_path, monkeypatch, capsys):
    from tallow.cli import main
    monkeypatch.delenv("TALLOW_WGPU_MATMUL", raising=False)
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path))
    assert main(["gpu", "tune", "--family", "qmatmul q8_0", "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)["families"]["qmatmul q8_0"]
    assert tuned["choice"] in ("simple", "tiled64") and tuned["seconds"][tuned["choice"]] > 0
    assert main(["gpu", "show", "--family", "qmatmul q8_0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["families"]["qmatmul q8_0"] == tuned
    assert main(["gpu", "show", "--family", "matmul f64"]) == 2
    assert "no matmul family 'matmul f64' here" in capsys.readouterr().err


def test_a_forced_or_default_tile_the_adapter_cannot_run_falls_back(tmp_path, monkeypatch):
    be, driver = null_backend(tmp_path, COSTS_TILED_WINS, measure=False)
    be.limits["max_invocations"] = 128  # tiled64 needs 256 threads per workgroup, tiled32 64
    monkeypatch.setenv("TALLOW_WGPU_MATMUL", "tiled64")
    assert be.tuning.choice("matmul f32") == "tiled32" and be.tuning.choice("qmatmul q4_k") == "simple"
    monkeypatch.delenv("TALLOW_WGPU_MATMUL")
    assert be.tuning.choice("matmul f32") == "tiled32"  # the default on a GPU, where it fits
