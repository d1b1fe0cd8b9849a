"""A captured CPU decoding step's kernel calls as one program for step_loop.run_step (see
step_loop.py for how the threads share it): `build(entries)` makes the Program from a
recording's entries, or returns None when an entry is not one of these kernels or an array is
not contiguous (the replay then calls the entries); Program.run() replays it. No numba here:
run_step comes through kernel_calls.step_kernels(), as machine code when machine_code loads it.
"""
import numpy as np

from ..kernels.codes import (OP_ATTENTION, OP_CALL, OP_CROSS_ATTENTION, OP_F16_PRODUCT, OP_LAYER_NORM, OP_PRODUCT,
                             OP_QUANTIZE, OP_ROWS, SHARED_ROWS, WIDTH)
from .threads import CHUNKS_PER_THREAD

# A program's chunk costs one atomic add (no hand-off through Python, as kernel_calls's
# PARALLEL_MIN_BYTES pays for), so it shares smaller products too: SmolLM2's attention output
# projections (186 KB, 30 a token) ran on thread 0 alone while the helper waited.
SHARE_MIN_BYTES = 1 << 16


class Program:
    """A recording's kernel calls as run_step's program (see the module doc); run() replays them."""

    def __init__(self, rows, reals, keep, step, checks):
        self.prog = np.array(rows, dtype=np.int64).reshape(len(rows), WIDTH)
        self.reals = np.array(reals, dtype=np.float64)
        self.keep = keep  # every array whose address the program holds: alive while it is
        self.step = step
        self.checks = checks  # (fn, args): the ids and positions a replay checks before the kernels
        self.state = np.zeros(2 * len(rows) + 2, dtype=np.int64)

    def run(self):
        from . import kernel_calls
        from ..kernels.codes import F16_TABLE
        for fn, args in self.checks:
            fn(*args)
        # a fresh state each step: a late helper still in the last step sees that one's, all taken
        state = self.state = np.zeros(2 * self.prog.shape[0] + 2, dtype=np.int64)
        args = (self.prog, self.reals, F16_TABLE, self.step, state)
        run_step = kernel_calls.step_kernels().run_step
        pool = kernel_calls.pool()
        if pool is not None:
            pool.share(run_step, args, _helper_rounds())
        if run_step(*args, 0, 0):
            raise RuntimeError("cpu step: a helper thread never finished its chunk of a product")


HELPER_WAIT_US = 2000  # how long a helper waits for thread 0 to publish the step's next product
_rounds: list[int] = []


def _helper_rounds():
    if not _rounds:
        from . import polls
        _rounds.append(polls.rounds_for(HELPER_WAIT_US))
    return _rounds[0]


class _NotProgram(Exception):
    pass


def build(entries):
    """The Program of a recording's (fn, args) entries, or None when one is not a kernel call
    run_step knows or an array is not contiguous; and under NUMBA_DISABLE_JIT=1 (its atomics are
    compiled code)."""
    from ..kernels import machine_code
    from . import capture, kernel_calls
    if machine_code.jit_disabled():
        return None
    ints, decode = kernel_calls.int_kernels(), kernel_calls.decode_kernels()
    rows: list[list[int]] = []
    reals: list[float] = []
    checks: list[tuple] = []
    keep: list[np.ndarray] = []
    step = np.zeros(4, dtype=np.uint32)  # (no attention: nothing reads it)
    threads = kernel_calls.threads()

    def chunks(n, nbytes):
        return min(n, threads * CHUNKS_PER_THREAD) if nbytes >= SHARE_MIN_BYTES and threads > 1 else 1

    def at(a, dtype):
        """a's address, for an array run_step may view as dtype (C-contiguous, that dtype)."""
        if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
            raise _NotProgram
        keep.append(a)
        return a.__array_interface__["data"][0]

    def row(*values, shared=(0, 0)):
        rows.append(list(values) + [0] * (SHARED_ROWS - len(values)) + list(shared))

    f32, i16, i32, u8, i64 = (np.dtype(t) for t in (np.float32, np.int16, np.int32, np.uint8, np.int64))
    try:
        for fn, args in entries:
            real = 0.0
            if fn is ints.quantize_rows:
                x, qmax, qx, dx, sx = args
                m, k = x.shape
                row(OP_QUANTIZE, at(x, f32), m, k, at(qx, i16), at(dx, f32), at(sx, i32), qmax)
            elif fn is kernel_calls.run_product:
                (fmt, bs, bb, raw, qx, dx, sx, _table, out, bias, gated, act), n, _shared = args
                m, k = qx.shape
                row(OP_PRODUCT, fmt, bs, bb, at(raw, u8), at(qx, i16), at(dx, f32), at(sx, i32), at(out, f32),
                    at(bias, f32), int(gated), act, m, k, out.shape[1], bias.size, raw.size,
                    shared=(n, chunks(n, raw.size)))
            elif fn is kernel_calls.run_f16_product:
                (raw, x, out, bias), n, _shared = args
                m, k = x.shape
                row(OP_F16_PRODUCT, at(raw, u8), at(x, f32), at(out, f32), at(bias, f32), m, k, n, raw.size, bias.size,
                    shared=(n, chunks(n, raw.size)))
            elif fn is kernel_calls.run_cross_attention:
                (q, kc, vc, real, out), = args
                b, h, t, d = q.shape
                bk, _h, tk, dv = vc.shape
                row(OP_CROSS_ATTENTION, at(q, f32), at(kc, f32), at(vc, f32), at(out, f32), b, h, t, d, dv, bk, tk,
                    shared=(b * h, chunks(b * h, kc.nbytes)))
            elif fn is kernel_calls.check_ids:  # (a check before the kernels, not a row)
                checks.append((fn, args))
                continue
            elif fn is decode.add_layer_norm:
                x, r, w, bias, real, total, normed = args
                m, d = x.shape
                row(OP_LAYER_NORM, at(x, f32), at(r, f32), at(w, f32), at(total, f32), at(normed, f32), m, d,
                    at(bias, f32), w.size, bias.size)
            elif fn is capture.cache_attention:
                _kernel, step, rel, q, k, v, cos, sin, kc, vc, key_start, real, interleaved, out = args
                b, h, t, d = q.shape
                _, hk, cap, dv = vc.shape
                if cos.shape != sin.shape:
                    raise _NotProgram
                row(OP_ATTENTION, at(q, f32), at(k, f32), at(v, f32), at(cos, f32), at(sin, f32), rel, at(kc, f32),
                    at(vc, f32), key_start, int(interleaved), at(out, f32), b, h, hk, t, d, dv, cap, cos.shape[0],
                    cos.shape[1])
                check = (capture.check_position, (step, t, cap, rel, cos.shape[0]))
                if check not in checks:  # (the same for every layer)
                    checks.append(check)
            elif fn is kernel_calls.checked_rows:
                n_rows, (fmt, bs, bb, raw, ids, k, _table, out) = args
                row(OP_ROWS, fmt, bs, bb, at(raw, u8), at(ids, i64), k, at(out, f32), ids.size, raw.size)
                checks.append((kernel_calls.check_ids, (ids, n_rows)))
            else:  # a kernel declared with a step form (codes.entry(step=True)): its row is its arguments
                name = machine_code.step_entry(fn)
                address = None if name is None else machine_code.step_form(name)
                values = None if address is None else machine_code.step_args(name, args)
                if values is None or len(values) > SHARED_ROWS - 2:
                    return None
                keep.extend(a for a in args if isinstance(a, np.ndarray))
                row(OP_CALL, address, *values)
            reals.append(float(real))
    except _NotProgram:
        return None
    return Program(rows, reals, keep, step, checks)
