"""The CPU kernels' machine code loaded without numba (tallow.backends.cpu.kernels.machine_code): every entry
loads and computes what its numba kernel computes, a warm process never imports numba, and a
broken cache or a call the entry cannot take falls back to numba instead of crashing."""
import json
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("numba")

from tallow.backends.cpu.kernels import machine_code  # noqa: E402
from tallow.backends.cpu.runtime import kernel_calls  # noqa: E402

pytestmark = pytest.mark.skipif(not machine_code.enabled(), reason="TALLOW_CPU=numba or NUMBA_DISABLE_JIT=1")


def test_every_entry_loads_as_machine_code():
    for name in machine_code.ENTRIES:
        assert machine_code.kernel(name) is not None, machine_code.errors()
        assert machine_code.kernel(name).native


def _rows_and_blocks(rng, m=3, k=64, n=10):
    """x (m, k) and the q4_1 blocks of an (n, k) matrix: random bytes, finite f16 scale and min."""
    raw = rng.integers(0, 256, size=(n * k // 32, 24), dtype=np.uint8)
    raw[:, :4] = rng.uniform(-2, 2, size=(n * k // 32, 2)).astype(np.float16).view(np.uint8)
    return rng.standard_normal((m, k)).astype(np.float32), raw.reshape(-1)


def test_entries_compute_what_the_numba_kernels_compute():
    rng = np.random.default_rng(0)
    x, raw = _rows_and_blocks(rng)
    m, k = x.shape
    results = []
    for fn in (machine_code.kernel("quantize_rows"), machine_code.numba_kernel("quantize_rows")):
        qx, dx, sx = np.zeros((m, k), np.int16), np.zeros((m, k // 32), np.float32), np.zeros((m, k // 32), np.int32)
        fn(x, 32767, qx, dx, sx)
        out = np.zeros((m, 10), np.float32)
        product = (machine_code.kernel("qmatmul_shared") if fn.__dict__.get("native")
                   else machine_code.numba_kernel("qmatmul_shared"))
        from tallow.backends.cpu.kernels.codes import F16_TABLE
        last = product(1, 32, 24, raw, qx, dx, sx, F16_TABLE, out, np.empty(0, np.float32), False, 0, 10, 3,
                       np.zeros(2, np.int64))
        assert last is True
        results.append((qx, dx, sx, out))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_a_strided_view_takes_the_strided_entry_and_a_non_contiguous_one_falls_back():
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((1, 2, 1, 8)).astype(np.float32) for _ in range(2))
    caches = [np.zeros((1, 2, 5, 8), np.float32) for _ in range(2)]
    machine_code.kernel("kv_write")(k, v, caches[0][:, :, 3:4], caches[1][:, :, 3:4])  # ("f32[4A]" views)
    np.testing.assert_array_equal(caches[0][:, :, 3:4], k)
    np.testing.assert_array_equal(caches[1][:, :, 3:4], v)
    x = rng.standard_normal((2, 96)).astype(np.float32)[:, ::2]  # not contiguous: the numba kernel runs it
    r = np.zeros((2, 48), np.float32)
    w = np.ones(48, np.float32)
    got = [np.zeros((2, 48), np.float32) for _ in range(2)]
    machine_code.kernel("add_rms_norm")(x, r, w, 1e-6, got[0], got[1])
    np.testing.assert_allclose(got[1], x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)


def test_rms_norm_and_binary_kernels_match_numpy():
    """The captured step's own rms_norm (sums in float64, one rounding) and binary_f32 (numpy's
    float32 add/sub/mul: the same bits), as machine code and as numba's kernels."""
    from tallow.backends.cpu.kernels.codes import BINARY_CODES
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 48)) * 40).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    b = rng.standard_normal(x.size).astype(np.float32)
    for get in (machine_code.kernel, machine_code.numba_kernel):
        for weight, ref in ((w, want * w), (np.empty(0, np.float32), want)):
            got = np.full_like(x, np.nan)
            get("rms_norm")(x, weight, 1e-6, got)
            np.testing.assert_allclose(got, ref, rtol=2e-7, atol=1e-7)
        a = x.reshape(-1)
        for op, fn in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply)):
            for other in (b, b[:1]):
                got = np.full_like(a, np.nan)
                get("binary_f32")(a, other, BINARY_CODES[op], got)
                np.testing.assert_array_equal(got, fn(a, other))


def _child(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **env))


WARM = """
import sys, numpy as np
import tallow
from tallow import functional as F
from tallow.backends.cpu.kernels import machine_code
rng = np.random.default_rng(3)
w = tallow.from_numpy(rng.standard_normal((64, 64)).astype(np.float32)).to(tallow.get_dtype("q4_1"))
x = tallow.from_numpy(rng.standard_normal((1, 64)).astype(np.float32))
y = F.linear(x, w)
print(round(float(y.numpy().sum()), 3), "numba" in sys.modules, machine_code.errors())
"""


def test_a_warm_process_computes_without_importing_numba():
    first = _child(WARM)  # (compiles what is missing)
    assert first.returncode == 0, first.stderr
    warm = _child(WARM)
    assert warm.returncode == 0, warm.stderr
    total, imported, errors = warm.stdout.split(" ", 2)
    assert (imported, errors.strip()) == ("False", "[]")
    off = _child(WARM, TALLOW_CPU="numba")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split(" ", 2)[:2] == [total, "True"]  # numba's own kernels: the same product


@pytest.mark.slow  # compiles the numba kernels afresh in a child process
def test_a_broken_cache_falls_back_to_numba_with_a_reason(tmp_path):
    env = {"TALLOW_HOME": str(tmp_path)}
    assert _child(WARM, **env).returncode == 0
    [folder] = (tmp_path / "cpu_kernels").iterdir()
    obj = folder / "qmatmul_shared.o"
    obj.write_bytes(obj.read_bytes()[:100])  # truncated
    manifest = folder / "quantize_rows.json"
    fields = json.loads(manifest.read_text())
    fields["external"].append("tallow_no_such_symbol")
    manifest.write_text(json.dumps(fields))
    done = _child(WARM, **env)
    assert done.returncode == 0, done.stderr
    assert "True" in done.stdout  # numba ran those two
    assert "qmatmul_shared" in done.stdout and "truncated" in done.stdout
    assert "quantize_rows" in done.stdout and "tallow_no_such_symbol" in done.stdout


def test_off_switch_and_what_tallow_devices_says():
    done = _child("from tallow.backends.cpu.kernels import machine_code; print(machine_code.kernel('poll'))",
                  TALLOW_CPU="numba")
    assert done.stdout.strip() == "None"
    assert kernel_calls.kernels() is not None
    status = "from tallow.backends.cpu.runtime import kernel_calls; print(kernel_calls.kernel_status())"
    assert _child(status).stdout.startswith("machine code compiled by numba")
    assert _child(status, TALLOW_CPU="numba").stdout.startswith("numba's")
    assert _child(status, TALLOW_CPU="numpy").stdout.startswith("off")
