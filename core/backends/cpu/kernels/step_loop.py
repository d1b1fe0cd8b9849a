"""A captured CPU decoding step (core/backends/cpu/runtime/capture.py) run as one nogil numba call per
thread, as ggml runs its graph: no Python and no GIL between the step's kernels.

A replay that calls its ~160 kernels from Python shares each large product with the helper
threads through threads.RowPool, one hand-off each; every hand-off needs the helper to take
the GIL that the replaying thread holds between kernels, and on 2 cores the step then ran slower
on 2 threads than on one (SmolLM2-135M Q4_1: 21.0 vs 16.5 ms a token, measured). Here the
recorded calls become a *program*: one row of ints per kernel call (its code, the addresses of its
arrays, their sizes) and one float per call (eps, scale); run_step views each address as an array
(numba's carray), and the Program holds the arrays so they stay alive. A kernel declared with
`@entry(..., step=True)` (codes.entry) needs no case here: its row is OP_CALL and the address of
its step form, a C function machine_code.py compiles to view the row's addresses as the
kernel's arrays, which run_step calls by address. Every thread runs
`run_step` over the whole program: thread 0 does the serial work (norms, activation quantisation,
attention, the embedding lookup, small products); a large product's row chunks are taken by
every thread from one atomic counter per call, as in threads. Thread 0 publishes each large
product when its inputs are ready and waits only for chunks a helper has taken, so a helper that
is never scheduled costs nothing; a late helper finds every chunk of the step taken and returns.

runtime/step_program.py makes the program from a recording's entries (and runs it); this module is the
numba side, which a process with the kernels' machine code cached never imports.
"""
import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from llvmlite import ir

from . import atomics, float_rows, fused_ops, int_dot
from .codes import (OP_ATTENTION, OP_CALL, OP_CROSS_ATTENTION, OP_F16_PRODUCT, OP_LAYER_NORM, OP_PRODUCT, OP_QUANTIZE,
                    OP_ROWS, SHARED_CHUNKS, SHARED_ROWS, entry)

WAIT_ROUNDS = 1 << 34  # polls before thread 0 gives up on a helper's chunk (minutes: a hang guard only)


def _pointer_from_address(nbtype):
    @intrinsic
    def as_pointer(typingctx, address):
        """The int64 address as a pointer to nbtype (the array there is kept alive by the Program)."""
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
        return types.CPointer(nbtype)(address), codegen
    return as_pointer


_f32_at, _i16_at, _i32_at, _u8_at, _i64_at, _f64_at, _u32_at = (_pointer_from_address(t) for t in (
    types.float32, types.int16, types.int32, types.uint8, types.int64, types.float64, types.uint32))
POINTER_AT = {"f32": _f32_at, "i16": _i16_at, "i32": _i32_at, "u8": _u8_at, "i64": _i64_at, "f64": _f64_at,
              "u32": _u32_at}  # (machine_code's step forms view a row's addresses with these)


@intrinsic
def float_bits(typingctx, bits):
    """The float64 whose bits are the int64 `bits` (a step form's float arguments travel in its row)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(bits), codegen


@intrinsic
def _call_step_form(typingctx, address, row):
    """Call the step form at `address` (a C function of one int64: its row's address)."""
    if not isinstance(address, types.Integer) or not isinstance(row, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1]])
        return context.get_dummy_value()
    return types.none(address, row), codegen


@njit(cache=True, inline="always")
def _wait_at_least(state, i, value, rounds):
    """Poll until state[i] >= value (at most rounds polls); True if it got there."""
    for _ in range(rounds):
        if atomics._load_acquire(state, i) >= value:
            return True
        atomics._cpu_relax()
    return False


@entry("i64[2]", "f64[1]", "f32[1]", "u32[1]", "i64[1]", "i64", "i64", returns="i64")
@njit(cache=True, nogil=True)
def run_step(prog, reals, table, step, state, tid, helper_rounds):
    """The program's calls in order on thread `tid` (0: the caller). state: int64 zeros of
    2 * len(prog) + 2 (per call: chunks taken, chunks done; then the large products published,
    and the chunks the helpers computed).
    Returns 0, or 1 when thread 0 gave up waiting for a helper's chunk."""
    n_ops = prog.shape[0]
    pub = 2 * n_ops
    shared_seen = 0
    for j in range(n_ops):
        p = prog[j]
        code = p[0]
        if code == OP_PRODUCT or code == OP_F16_PRODUCT or code == OP_CROSS_ATTENTION:
            # rows in chunks; a large op's taken by every thread, a small one's by thread 0
            n_rows, chunks = p[SHARED_ROWS], p[SHARED_CHUNKS]
            shared = chunks > 1
            if shared:
                shared_seen += 1
                if tid == 0:
                    atomics._fetch_add(state, pub, 1)
                elif not _wait_at_least(state, pub, shared_seen, helper_rounds):
                    return 0  # thread 0 is slow (or gone): it does the rest itself
            elif tid != 0:
                continue
            while True:  # (one call site of each kernel: the step's machine code stays smaller)
                c = atomics._fetch_add(state, 2 * j, 1)
                if c >= chunks:
                    break
                lo, hi = n_rows * c // chunks, n_rows * (c + 1) // chunks
                if code == OP_PRODUCT:
                    _product(p, table, lo, hi)
                elif code == OP_F16_PRODUCT:
                    _f16_product(p, lo, hi)
                else:
                    _cross_attention(p, reals[j], lo, hi)
                atomics._fetch_add(state, 2 * j + 1, 1)
                if tid != 0:
                    atomics._fetch_add(state, pub + 1, 1)
            if shared and tid == 0 and not _wait_at_least(state, 2 * j + 1, chunks, WAIT_ROUNDS):
                return 1
            continue
        if tid != 0:
            continue
        if code == OP_CALL:  # a kernel's step form (codes.entry), its arguments in the row from p[2]
            _call_step_form(p[1], p.ctypes.data)
        elif code == OP_QUANTIZE:
            m, k = p[2], p[3]
            int_dot.quantize_rows(carray(_f32_at(p[1]), (m, k)), p[7], carray(_i16_at(p[4]), (m, k)),
                                  carray(_f32_at(p[5]), (m, k // 32)), carray(_i32_at(p[6]), (m, k // 32)))
        elif code == OP_LAYER_NORM:
            m, d = p[6], p[7]
            fused_ops.add_layer_norm(carray(_f32_at(p[1]), (m, d)), carray(_f32_at(p[2]), (m, d)),
                                     carray(_f32_at(p[3]), (p[9],)), carray(_f32_at(p[8]), (p[10],)),
                                     reals[j], carray(_f32_at(p[4]), (m, d)), carray(_f32_at(p[5]), (m, d)))
        elif code == OP_ATTENTION:
            b, h, hk, t, d, dv, cap, rows, w = p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20]
            position = np.int64(step[0])
            cos = carray(_f32_at(p[4]), (rows, w))
            sin = carray(_f32_at(p[5]), (rows, w))
            if rows:
                at = position + p[6]
                cos, sin = cos[at:at + t], sin[at:at + t]
            q = carray(_f32_at(p[1]), (b, h, t, d))
            k = carray(_f32_at(p[2]), (b, hk, t, d))
            v = carray(_f32_at(p[3]), (b, hk, t, dv))
            kc = carray(_f32_at(p[7]), (b, hk, cap, d))
            vc = carray(_f32_at(p[8]), (b, hk, cap, dv))
            key_start = p[9]  # (< 0: a sliding window's -window, capture.cache_attention)
            if key_start < 0:
                key_start = max(np.int64(0), position + t + key_start)
            fused_ops.cache_attention(q, k, v, cos, sin, kc, vc, position, key_start, np.float32(reals[j]),
                                      p[10] != 0, carray(_f32_at(p[11]), (b, h, t, dv)))
        elif code == OP_ROWS:
            k, n_ids = p[6], p[8]
            float_rows.dequant_rows_blocks(p[1], p[2], p[3], carray(_u8_at(p[4]), (p[9],)),
                                           carray(_i64_at(p[5]), (n_ids,)), k, table,
                                           carray(_f32_at(p[7]), (n_ids, k)))
    return 0


@njit(cache=True)
def _product(p, table, lo, hi):
    m, k, n_out = p[12], p[13], p[14]
    qx = carray(_i16_at(p[5]), (m, k))
    dx = carray(_f32_at(p[6]), (m, k // 32))
    sx = carray(_i32_at(p[7]), (m, k // 32))
    out = carray(_f32_at(p[8]), (m, n_out))
    raw, bias = carray(_u8_at(p[4]), (p[16],)), carray(_f32_at(p[9]), (p[15],))
    int_dot.qmatmul_q(p[1], p[2], p[3], raw, qx, dx, sx, table, out, bias, p[10] != 0, p[11], lo, hi)


@njit(cache=True)
def _f16_product(p, lo, hi):
    m, k, n_out = p[5], p[6], p[7]
    float_rows.f16_rows(carray(_u8_at(p[1]), (p[8],)), carray(_f32_at(p[2]), (m, k)),
                        carray(_f32_at(p[3]), (m, n_out)), carray(_f32_at(p[4]), (p[9],)), lo, hi)


@njit(cache=True)
def _cross_attention(p, scale, lo, hi):
    b, h, t, d, dv, bk, tk = p[5], p[6], p[7], p[8], p[9], p[10], p[11]
    fused_ops.cross_attention_rows(carray(_f32_at(p[1]), (b, h, t, d)), carray(_f32_at(p[2]), (bk, h, tk, d)),
                                   carray(_f32_at(p[3]), (bk, h, tk, dv)), np.float32(scale),
                                   carray(_f32_at(p[4]), (b, h, t, dv)), lo, hi)
