"""backends/cpu/mapped_pages.py: after a copy, the file pages inside a mapped tensor are handed back,
and only those: the tensor still reads the same bytes, other memory is never advised."""
import mmap
import os
import sys

import numpy as np
import pytest

from tallow.io.lazy_file import map_source
from tallow.backends.cpu.mapped_pages import PAGE, release_copied

pytestmark = pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="no madvise here")


def _resident_pages(view):
    """Pages of `view` (a numpy view of a mapping) resident in this process, from /proc/self/pagemap
    (bit 63: present). Only the view's own pages: the kernel merges neighbouring anonymous mappings
    into one entry of /proc/self/smaps, so its Rss can count another allocation's pages."""
    address = view.__array_interface__["data"][0]
    first, last = address // PAGE, (address + view.nbytes - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


def test_pages_inside_a_mapped_tensor_are_released_and_read_back_unchanged(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, size=12 * PAGE, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    whole, _ = map_source(path)
    a = np.frombuffer(whole[100:5 * PAGE + 7], np.uint8)  # pages 1..4 lie wholly inside it
    b = np.frombuffer(whole[6 * PAGE:12 * PAGE], np.uint8)  # pages 6..11
    joined = np.concatenate([a, b])  # reads every page of both
    assert release_copied([a, b]) == 4 * PAGE + 6 * PAGE
    if sys.platform.startswith("linux"):
        assert _resident_pages(a) <= 2  # pages 0 and 5, shared with the bytes around a
    assert np.array_equal(joined, np.concatenate([data[100:5 * PAGE + 7], data[6 * PAGE:]]))
    assert np.array_equal(a, data[100:5 * PAGE + 7]) and np.array_equal(b, data[6 * PAGE:])  # faulted back in


def test_memory_that_is_not_a_read_only_mapping_is_left_alone():
    heap = np.arange(8 * PAGE, dtype=np.uint8)
    frozen = np.frombuffer(bytes(8 * PAGE), np.uint8)  # read-only, but a bytes object's memory
    assert release_copied([heap, frozen, heap[PAGE:]]) == 0
    assert heap[5 * PAGE + 3] == (5 * PAGE + 3) % 256


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_large_zeros_tensor_on_the_cpu_costs_only_the_pages_written():
    """NumpyBackend.full(0): a KV cache's positions not yet written cost no memory, whatever glibc's
    mmap threshold has grown to; the tensor reads as zeros and writes like any other."""
    import tallow
    big = np.ones(1 << 20, np.float32)
    del big  # freeing a 4 MB array raises glibc's mmap threshold past 2 MB
    cache = tallow.zeros(1, 2, 4096, 64, device="cpu")  # 2 MB
    view = cache._storage
    assert _resident_pages(view) == 0
    cache[:, :, :16] = tallow.ones(1, 2, 16, 64)
    assert _resident_pages(view) <= 2 * 2  # 16 positions of each head: one page, maybe two
    got = cache.numpy()
    assert got[:, :, :16].min() == 1 and not got[:, :, 16:].any()
    small = tallow.zeros(8, device="cpu")
    assert small.numpy().tolist() == [0.0] * 8
    assert str(tallow.full((3,), -0.0, device="cpu").numpy()[0]) == "-0.0"  # -0.0 keeps its sign
    pid = os.fork()  # private pages: a forked child's writes stay its own
    if pid == 0:
        view[:] = 7
        os._exit(0)
    os.waitpid(pid, 0)
    assert cache.numpy()[:, :, 16:].max() == 0




@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc: Linux only")
def test_a_freed_large_block_leaves_no_resident_pages():
    """With the process tuned (tallow.settings.tune_process), a freed block of 1 MB or more is
    unmapped, so a prompt's temporaries do not stay resident: under glibc's default policy the
    blocks after the first come from the heap, which keeps them."""
    from freed_blocks import resident_after_freeing
    setup = "import tallow.backends.cpu.backend, tallow.settings\ntallow.settings.tune_process()  # as the CLI does"
    assert resident_after_freeing(setup) < 1 << 20
