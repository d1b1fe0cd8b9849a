"""The threads' barrier (issue 31 item 4; docs/wasm.md "Threads"): `barrier(words, n)`, which every
one of the n threads running their share of a program (threads.py) calls at the same points, and
which returns in each only when all n have called it.

`words` is three i32s in the shared memory: the arrivals, the generation, and an abort flag. The
last of the n to arrive zeroes the arrivals, bumps the generation and wakes the others
(memory.atomic.notify); the others spin on the generation for a while (a barrier between two
threads that are both running costs well under a microsecond that way) and then sleep on it
(memory.atomic.wait32). A nonzero abort flag (a thread that trapped, set by driver.js) makes a
waiting thread trap too, so one failed kernel stops every thread instead of hanging them.

The threaded module (built with +atomics, linked with --shared-memory) has this body; the
one-thread kernels.wasm keeps its memory unshared and gets a barrier that returns for n <= 1 and
traps otherwise (atomic waits need a shared memory), so both modules have the same opcodes.
"""
from llvmlite import ir

from .kernels_ir import _I32, _I64, _function, _intrinsic, _slot

SPIN = 20000  # generation checks before a waiting thread sleeps


def add_barrier(module, threaded):
    b, (words, n) = _function(module, "barrier", [(_I32, None), (_I32, None)])
    one = ir.Constant(_I32, 1)
    done = b.append_basic_block("done")
    if not threaded:
        alone = b.icmp_signed("<=", n, one)
        trap = b.append_basic_block("trap")
        b.cbranch(alone, done, trap)
        b.position_at_end(trap)
        _intrinsic(b, "llvm.trap", ir.VoidType(), [])
        b.unreachable()
        b.position_at_end(done)
        b.ret_void()
        return
    p32 = _I32.as_pointer()
    arrivals = b.inttoptr(words, p32)
    generation = b.inttoptr(b.add(words, ir.Constant(_I32, 4)), p32)
    abort = b.inttoptr(b.add(words, ir.Constant(_I32, 8)), p32)
    gen = b.load_atomic(generation, "seq_cst", 4)
    before = b.atomic_rmw("add", arrivals, one, "seq_cst")
    last, wait = b.append_basic_block("last"), b.append_basic_block("wait")
    b.cbranch(b.icmp_signed("==", before, b.sub(n, one)), last, wait)
    b.position_at_end(last)
    b.store_atomic(ir.Constant(_I32, 0), arrivals, "seq_cst", 4)
    b.atomic_rmw("add", generation, one, "seq_cst")
    _intrinsic(b, "llvm.wasm.memory.atomic.notify", _I32, [generation, ir.Constant(_I32, -1)])
    b.branch(done)
    # spin: up to SPIN loads of the generation
    b.position_at_end(wait)
    spins = _slot(b, ir.Constant(_I32, 0))
    spin, sleep = b.append_basic_block("spin"), b.append_basic_block("sleep")
    b.branch(spin)
    b.position_at_end(spin)
    moved = b.icmp_signed("!=", b.load_atomic(generation, "seq_cst", 4), gen)
    count = b.add(b.load(spins), one)
    b.store(count, spins)
    b.cbranch(b.or_(moved, b.icmp_signed(">", count, ir.Constant(_I32, SPIN))), sleep, spin)
    # sleep until the generation moves (or the barrier is aborted)
    b.position_at_end(sleep)
    check, stop, nap = (b.append_basic_block(name) for name in ("check", "stop", "nap"))
    b.branch(check)
    b.position_at_end(check)
    b.cbranch(b.icmp_signed("!=", b.load_atomic(abort, "seq_cst", 4), ir.Constant(_I32, 0)), stop, nap)
    b.position_at_end(stop)
    _intrinsic(b, "llvm.trap", ir.VoidType(), [])
    b.unreachable()
    b.position_at_end(nap)
    still = b.icmp_signed("==", b.load_atomic(generation, "seq_cst", 4), gen)
    sleeping = b.append_basic_block("sleeping")
    b.cbranch(still, sleeping, done)
    b.position_at_end(sleeping)
    _intrinsic(b, "llvm.wasm.memory.atomic.wait32", _I32, [generation, gen, ir.Constant(_I64, -1)])
    b.branch(check)
    b.position_at_end(done)
    b.ret_void()
