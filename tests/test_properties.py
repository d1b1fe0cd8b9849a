"""Property tests: broadcasting and view composition agree with numpy for any shapes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow

DEVICES = [d for d in ("cpu", "python") if d in tallow.devices()]
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


@st.composite
def broadcastable(draw):
    out = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    a = [s if draw(st.booleans()) else 1 for s in out]
    b = [s if draw(st.booleans()) else 1 for s in out][draw(st.integers(0, len(out))):]
    return tuple(a), tuple(b)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(pair=broadcastable(), seed=st.integers(0, 2**16))
def test_broadcasting_matches_numpy(device, pair, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(pair[0]).astype(np.float32), rng.standard_normal(pair[1]).astype(np.float32)
    x, y = tallow.from_numpy(a, device), tallow.from_numpy(b, device)
    np.testing.assert_allclose((x * y + x).numpy(), a * b + a, rtol=1e-6, atol=1e-6)
    assert (x < y).tolist() == (a < b).tolist()


@st.composite
def view_chain(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    steps = []
    cur = list(shape)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["transpose", "narrow", "unsqueeze", "slice", "flip_perm", "reshape"]))
        n = len(cur)
        if kind == "transpose" and n >= 2:
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            steps.append(("transpose", i, j))
            cur[i], cur[j] = cur[j], cur[i]
        elif kind == "narrow":
            d = draw(st.integers(0, n - 1))
            start = draw(st.integers(0, cur[d] - 1))
            length = draw(st.integers(1, cur[d] - start))
            steps.append(("narrow", d, start, length))
            cur[d] = length
        elif kind == "unsqueeze" and n < 5:
            d = draw(st.integers(0, n))
            steps.append(("unsqueeze", d))
            cur.insert(d, 1)
        elif kind == "slice":
            d = draw(st.integers(0, n - 1))
            step = draw(st.integers(1, 3))
            steps.append(("slice", d, step))
            cur[d] = len(range(0, cur[d], step))
        elif kind == "flip_perm" and n >= 1:
            perm = draw(st.permutations(range(n)))
            steps.append(("permute", tuple(perm)))
            cur = [cur[p] for p in perm]
        elif kind == "reshape":
            steps.append(("reshape",))
            cur = [int(np.prod(cur))]
    return tuple(shape), steps


def _apply(x, step, is_np):
    kind = step[0]
    if kind == "transpose":
        return np.swapaxes(x, step[1], step[2]) if is_np else x.transpose(step[1], step[2])
    if kind == "narrow":
        _, d, s, n = step
        return x[(slice(None),) * d + (slice(s, s + n),)]
    if kind == "unsqueeze":
        return np.expand_dims(x, step[1]) if is_np else x.unsqueeze(step[1])
    if kind == "slice":
        return x[(slice(None),) * step[1] + (slice(None, None, step[2]),)]
    if kind == "permute":
        return np.transpose(x, step[1]) if is_np else x.permute(step[1])
    return x.reshape(-1)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(chain=view_chain())
def test_view_composition_matches_numpy(device, chain):
    shape, steps = chain
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    x = tallow.from_numpy(a, device)
    for s in steps:
        a, x = _apply(a, s, True), _apply(x, s, False)
    assert x.shape == a.shape
    assert x.tolist() == a.tolist()
    assert (x + 0).tolist() == a.tolist()  # through a backend op on the strided layout
