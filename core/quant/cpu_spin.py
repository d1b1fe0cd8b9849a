"""A helper thread's short busy wait for the next product, without the GIL (numba).

A decoding step hands its helpers ~5 products per layer, a few tens of microseconds apart
(the Python in between). A helper blocked in the kernel's futex takes 5-50 us to wake (longer
when its core idles in a deep sleep state), which is most of a small product: the caller has
done the chunks by the time the helper arrives. So a helper that finishes a job first polls a
counter the caller bumps with each new job, for about SPIN_US, and only then blocks (ggml's
threads poll the same way). The bound keeps the cost on a busy box to a fraction of a core
between tokens.

The counter is read with an atomic load (an LLVM intrinsic through numba): a plain load in
the loop would be hoisted out of it. Under NUMBA_DISABLE_JIT=1 the same loop runs in Python.
"""
import time

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

SPIN_US = 200  # how long a helper polls for the next job before it blocks


@intrinsic
def _load_acquire(typingctx, arr):
    """arr[0] of an int64 array, as an atomic acquire load."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        ptr = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load_atomic(ptr, "acquire", 8)
    return types.int64(arr), codegen


@intrinsic
def _cpu_relax(typingctx):
    """A spin-loop hint: x86's pause (arm64 and others: nothing, the atomic load suffices)."""
    def codegen(context, builder, signature, args):
        if "x86" in builder.module.triple:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.none(), codegen


@njit(cache=True, nogil=True)
def _spin_while_equal(counter, seen, rounds):
    for _ in range(rounds):
        if _load_acquire(counter) != seen:
            return True
        _cpu_relax()
    return False


def _spin_py(counter, seen, rounds):
    for _ in range(rounds):
        if counter[0] != seen:
            return True
    return False


spin_while_equal = _spin_py if config.DISABLE_JIT else _spin_while_equal  # type: ignore[attr-defined]


def rounds_for(microseconds):
    """Polling rounds that take about `microseconds` here (measured once: a pause costs 10-150
    cycles depending on the CPU)."""
    counter = np.zeros(1, dtype=np.int64)
    spin_while_equal(counter, 0, 10)  # compile / load from cache
    n = 20000
    t = time.perf_counter()
    spin_while_equal(counter, 0, n)
    per_round = max((time.perf_counter() - t) / n, 1e-9)
    return max(1, int(microseconds * 1e-6 / per_round))
