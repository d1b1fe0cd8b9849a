"""functional.batch_cache_attention (a batched decoding step's attention for one layer): every row
written into its own cache and attended over it at its own position gives exactly what
cache_attention gives that row alone, on the CPU kernels (one batch_attention call for all
the rows) and on base.py's row-by-row default (TALLOW_CPU=numpy)."""
import numpy as np
import pytest

import tallow
from tallow import functional as F
from tallow.errors import ShapeError

pytest.importorskip("numba")
from tallow.backends.cpu.runtime import kernel_calls  # noqa: E402

H, HK, D = 6, 2, 8
# (capacity, position, key_start) of each row: different lengths, a window's key_start, a full cache
ROWS = [(9, 4, 0), (16, 0, 0), (12, 7, 3), (9, 8, 0)]


def _operands(rng, rotary):
    b = len(ROWS)
    q, k, v = (rng.standard_normal((b, n, 1, D)).astype(np.float32) for n in (H, HK, HK))
    caches = [rng.standard_normal((2, 1, HK, cap, D)).astype(np.float32) for cap, _p, _s in ROWS]
    tables = [rng.standard_normal((b, D // 2)).astype(np.float32) for _ in range(2)] if rotary is not None else None
    return q, k, v, caches, tables


def _alone(q, k, v, caches, tables, rotary):
    """Each row by cache_attention, on its own copy of its caches: (outputs, caches after)."""
    outs, after = [], []
    for i, (_cap, position, key_start) in enumerate(ROWS):
        kc, vc = (tallow.from_numpy(c.copy()) for c in caches[i])
        cs = [None, None] if tables is None else [tallow.from_numpy(t[i:i + 1].copy()) for t in tables]
        row = [tallow.from_numpy(a[i:i + 1].copy()) for a in (q, k, v)]
        outs.append(F.cache_attention(*row, kc, vc, position, *cs, interleaved=bool(rotary), key_start=key_start).numpy())
        after.append((kc.numpy(), vc.numpy()))
    return np.concatenate(outs, 0), after


def _batched(q, k, v, caches, tables, rotary):
    kcs = [tallow.from_numpy(c[0].copy()) for c in caches]
    vcs = [tallow.from_numpy(c[1].copy()) for c in caches]
    cs = [None, None] if tables is None else [tallow.from_numpy(t) for t in tables]
    out = F.batch_cache_attention(*(tallow.from_numpy(a) for a in (q, k, v)), kcs, vcs, [p for _c, p, _s in ROWS],
                                  *cs, interleaved=bool(rotary), key_starts=[s for _c, _p, s in ROWS])
    return out.numpy(), [(kc.numpy(), vc.numpy()) for kc, vc in zip(kcs, vcs)]


@pytest.mark.parametrize("cpu", ["kernels", "numpy"])
@pytest.mark.parametrize("rotary", [None, False, True])  # no rotation, half-split pairs, interleaved pairs
def test_each_row_is_its_cache_attention_alone(cpu, rotary, monkeypatch):
    for name in ("TALLOW_CPU", "TALLOW_CPU_KERNELS", "TALLOW_NATIVE_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    assert kernel_calls.kernels() is not None  # (loads them: decode_kernels() answers from then on)
    calls = []
    if cpu == "numpy":
        monkeypatch.setenv("TALLOW_CPU", "numpy")
        assert kernel_calls.batch_kernels() is None
    else:
        real = kernel_calls.batch_kernels().batch_cache_attention
        monkeypatch.setattr(kernel_calls.batch_kernels(), "batch_cache_attention",
                            lambda *a: (calls.append(1), real(*a))[1])
    args = _operands(np.random.default_rng(3), rotary)
    want, want_caches = _alone(*args, rotary)
    got, got_caches = _batched(*args, rotary)
    assert calls == ([1] if cpu == "kernels" else [])  # one kernel call for the whole batch
    assert got.shape == (len(ROWS), H, 1, D)
    np.testing.assert_array_equal(got, want)  # bit for bit
    for (gk, gv), (wk, wv) in zip(got_caches, want_caches):
        np.testing.assert_array_equal(gk, wk)
        np.testing.assert_array_equal(gv, wv)


def test_bad_batches_are_refused():
    rng = np.random.default_rng(4)
    q, k, v, caches, _t = _operands(rng, None)
    qkv = [tallow.from_numpy(a) for a in (q, k, v)]
    kcs = [tallow.from_numpy(c[0]) for c in caches]
    vcs = [tallow.from_numpy(c[1]) for c in caches]
    positions = [p for _c, p, _s in ROWS]
    with pytest.raises(ShapeError, match="one of each per sequence"):
        F.batch_cache_attention(*qkv, kcs, vcs, positions[:-1])
    with pytest.raises(ShapeError, match="does not fit a cache of capacity 9"):
        F.batch_cache_attention(*qkv, kcs, vcs, [4, 0, 7, 9])  # row 3's cache is full
    with pytest.raises(ShapeError, match="one rotary row per sequence"):
        table = tallow.from_numpy(np.zeros((1, D // 2), np.float32))
        F.batch_cache_attention(*qkv, kcs, vcs, positions, table, table)
    with pytest.raises(ShapeError, match=r"\(1, kv heads, capacity, head_dim\)"):
        F.batch_cache_attention(*qkv, kcs[:1] + [tallow.from_numpy(caches[1][0][:, :1])] + kcs[2:], vcs, positions)
