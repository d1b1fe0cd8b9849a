"""Layout's iteration plans (the helpers every backend uses) against numpy's strided views.

Each random layout is a view made the way tallow makes views (permute, narrow, broadcast)
over a numbered buffer; numpy's as_strided of the same buffer gives the reference element order.
"""
import random

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import tallow
from tallow.layout import Layout, coalesce_dims, inverse_permutation, kernel_meta

RNG = random.Random(0)
BUFFER = np.arange(5 ** 6 + 16, dtype=np.int64)  # room for the largest view below


def random_view(rank):
    """A permuted, narrowed, possibly broadcast view over BUFFER."""
    layout = Layout([RNG.randint(1, 5) for _ in range(rank)], None, RNG.randint(0, 7))
    perm = list(range(rank))
    RNG.shuffle(perm)
    layout = layout.permute(perm)
    for d in range(rank):
        if layout.shape[d] > 1 and RNG.random() < 0.3:
            start = RNG.randint(0, layout.shape[d] - 1)
            layout = layout.narrow(d, start, RNG.randint(1, layout.shape[d] - start))
    if RNG.random() < 0.4:
        layout = layout.broadcast_to((3,) + layout.shape)
    return layout


def numpy_view(layout):
    item = BUFFER.itemsize
    return as_strided(BUFFER[layout.offset:], layout.shape, [s * item for s in layout.strides], writeable=False)


def walk(shape, offset, strides):
    """Storage offsets in row-major order of (shape, strides), written out independently of Layout."""
    out = []
    for i in range(int(np.prod(shape, dtype=np.int64))):
        off, rest = offset, i
        for size, stride in zip(reversed(shape), reversed(strides)):
            off += (rest % size) * stride
            rest //= size
        out.append(off)
    return out


@pytest.mark.parametrize("rank", range(7))
def test_coalesced_keeps_numpys_element_order_in_fewer_dims(rank):
    for _ in range(30):
        layout = random_view(rank)
        merged = layout.coalesced()
        want = numpy_view(layout).reshape(-1).tolist()
        assert walk(merged.shape, merged.offset, merged.strides) == want
        assert 1 not in merged.shape and len(merged.shape) <= len(layout.shape)
        if layout.is_contiguous():
            assert len(merged.shape) <= 1  # a contiguous tensor of any rank is one run


def test_coalesce_dims_merges_only_what_every_operand_allows():
    shape, (st,) = coalesce_dims([2, 3, 4], [[12, 4, 1]])
    assert shape == [24] and st == [1]
    # the second operand (a transpose) keeps the two dims apart; size-1 dims go
    shape, (sa, sb) = coalesce_dims([4, 1, 3], [[3, 99, 1], [1, 5, 4]])
    assert shape == [4, 3] and sa == [3, 1] and sb == [1, 4]
    assert coalesce_dims([], [[]]) == ([], [[]])


@pytest.mark.parametrize("rank", range(1, 6))
def test_moved_last_gives_rows_of_the_reduced_elements(rank):
    for _ in range(20):
        layout = random_view(rank)
        nd = len(layout.shape)
        dims = tuple(sorted(RNG.sample(range(nd), RNG.randint(1, nd))))
        perm, moved = layout.moved_last(dims)
        assert perm[-len(dims):] == list(dims) and sorted(perm) == list(range(nd))
        x = numpy_view(layout)
        rows = np.asarray(walk(moved.shape, moved.offset, moved.strides)).reshape(-1, int(np.prod([x.shape[d] for d in dims])))
        np.testing.assert_array_equal(rows.sum(1).reshape([x.shape[d] for d in perm[:nd - len(dims)]]), x.sum(axis=dims))
        inv = inverse_permutation(perm)
        assert np.transpose(np.transpose(x, perm), inv).tolist() == x.tolist()


@pytest.mark.parametrize("rank", range(7))
def test_kernel_meta_locates_every_element_of_every_operand(rank):
    """Decode the words as the kernels do (gpu_kernels/common.h strided_offset) and compare with numpy."""
    max_dims = 8
    for _ in range(20):
        a = random_view(rank)
        b = Layout(a.shape, [RNG.choice([0, 1, 2, 7]) for _ in a.shape], RNG.randint(0, 5))
        words = kernel_meta(a.shape, [a, (b.offset, b.strides)], max_dims, slots=3)
        assert len(words) == 1 + max_dims + 3 * (max_dims + 1)
        nd = words[0]
        shape = words[1:1 + nd]
        for k, lay in enumerate((a, b)):
            base = 1 + max_dims + k * (max_dims + 1)
            got = walk(shape, words[base], words[base + 1:base + 1 + nd])
            assert got == numpy_view(lay).reshape(-1).tolist()
        assert words[1 + max_dims + 2 * (max_dims + 1):] == [0] * (max_dims + 1)  # the empty slot


def test_kernel_meta_limits_are_clear_errors():
    ten = (2,) * 10
    assert kernel_meta(ten, [Layout(ten)], 8)[0] == 1
    with pytest.raises(tallow.UnsupportedError, match="dims remain"):
        kernel_meta(ten, [Layout(ten, [2 ** (2 * i + 1) for i in range(10)])], 8, "copy")
    with pytest.raises(tallow.UnsupportedError, match="2\\*\\*31"):
        kernel_meta((2, 2), [Layout((2, 2), (1 << 31, 1))], 8)
    unmerged = kernel_meta((2, 3), [Layout((2, 3))], 8, coalesce=False)
    assert unmerged[:3] == [2, 2, 3]
