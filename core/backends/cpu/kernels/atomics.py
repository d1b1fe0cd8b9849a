"""Atomic counters and short polls for the CPU threads, without the GIL (numba intrinsics).

threads.RowPool's threads share a product's chunks of rows inside the kernel call:
each takes the next chunk with an atomic fetch-and-add on a small int64 array and counts
the chunks it finishes the same way, so a product costs each thread one kernel call, not
one Python call (holding the GIL) per chunk.

A decoding step hands its helpers ~5 products per layer, tens of microseconds apart (the
Python in between). A helper blocked in the kernel's futex takes 5-50 us to wake, most of
a small product, so a helper that finishes a job polls a counter the caller bumps with
each new job for about SPIN_US before it blocks (ggml's threads poll the same way); the
caller polls the same way for a helper's last chunk. The bound keeps the cost on a busy
box to a fraction of a core between tokens.

Loads in a poll are atomic acquire loads: a plain load in the loop would be hoisted out of
it. Under NUMBA_DISABLE_JIT=1 the same loops run in Python (where the GIL makes the
read-modify-write of fetch_add atomic). The waits built on `poll` are polls.py.
"""
from llvmlite import ir

from .numba_setup import prepare

prepare()  # before any kernel loads (numba_setup.py)
from numba import njit  # noqa: E402
from numba.core import cgutils, config, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from .codes import entry  # noqa: E402


def _slot(context, builder, signature, args):
    """A pointer to arr[i] (arr a C int64 array, i an integer)."""
    arr = context.make_array(signature.args[0])(context, builder, args[0])
    i = context.cast(builder, args[1], signature.args[1], types.int64)
    return builder.gep(arr.data, [i])


def _int64_array(arr):
    return isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"


@intrinsic
def _load_acquire(typingctx, arr, i):
    """arr[i], as an atomic acquire load."""
    if not _int64_array(arr) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_slot(context, builder, signature, args), "acquire", 8)
    return types.int64(arr, i), codegen


@intrinsic
def _fetch_add(typingctx, arr, i, value):
    """arr[i] += value atomically; the value before."""
    if not _int64_array(arr) or not isinstance(i, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        add = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", _slot(context, builder, signature, args), add, "seq_cst")
    return types.int64(arr, i, value), codegen


@intrinsic
def _cpu_relax(typingctx):
    """A spin-loop hint: x86's pause (elsewhere nothing: the atomic load suffices)."""
    def codegen(context, builder, signature, args):
        if "x86" in builder.module.triple:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.none(), codegen


@entry("i64[1]", "i64", "i64", "bool", "i64", returns="bool", name="poll")
@njit(cache=True, nogil=True)
def _poll(counter, i, value, equal, rounds):
    for _ in range(rounds):
        if (_load_acquire(counter, i) == value) == equal:
            return True
        _cpu_relax()
    return False


def _poll_py(counter, i, value, equal, rounds):
    for _ in range(rounds):
        if (counter[i] == value) == equal:
            return True
    return False


def _fetch_add_py(arr, i, value):
    old = int(arr[i])
    arr[i] = old + value
    return old


# (NUMBA_DISABLE_JIT is read at import) intrinsics cannot run as Python
fetch_add = _fetch_add_py if config.DISABLE_JIT else _fetch_add  # type: ignore[attr-defined]
poll = _poll_py if config.DISABLE_JIT else _poll  # type: ignore[attr-defined]
