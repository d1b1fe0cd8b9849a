"""Bounded waits on a counter without the GIL (atomics.poll: atomic acquire loads and a
spin hint), for threads.RowPool and the captured step's helpers. The poll is the native
entry (machine_code.py) when its machine code loads, else numba's, else (under
NUMBA_DISABLE_JIT=1) its Python form: this module itself never imports numba."""
import time

import numpy as np

SPIN_US = 200  # how long a thread polls for the next job, or the last chunk, before it blocks
_poll: list = []


def poll(counter, i, value, equal, rounds):
    """True once (counter[i] == value) == equal, polling at most `rounds` times; else False."""
    if not _poll:
        from ..kernels import machine_code
        fn = machine_code.kernel("poll")
        if fn is None:
            fn = machine_code.numba_module("atomics").poll
        _poll.append(fn)
    return _poll[0](counter, i, value, equal, rounds)


def wait_while_equal(counter, i, value, rounds):
    """Poll (without the GIL) until counter[i] != value, at most `rounds` times; True if it changed."""
    return poll(counter, i, value, False, rounds)


def wait_until_equal(counter, i, value, rounds):
    """Poll until counter[i] == value, at most `rounds` times; True if it got there."""
    return poll(counter, i, value, True, rounds)


def rounds_for(microseconds):
    """Polling rounds that take about `microseconds` here (measured once: a pause costs 10-150
    cycles depending on the CPU)."""
    counter = np.zeros(1, dtype=np.int64)
    poll(counter, 0, 1, True, 10)  # load the kernel
    n = 20000
    t = time.perf_counter()
    poll(counter, 0, 1, True, n)
    per_round = max((time.perf_counter() - t) / n, 1e-9)
    return max(1, int(microseconds * 1e-6 / per_round))
