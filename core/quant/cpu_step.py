"""A captured CPU decoding step (core/backends/cpu_capture.py) run as one nogil numba call per
thread, as ggml runs its graph: no Python and no GIL between the step's kernels.

A replay that calls its ~160 kernels from Python shares each large product with the helper
threads through cpu_threads.RowPool, one hand-off each; every hand-off needs the helper to take
the GIL that the replaying thread holds between kernels, and on 2 cores the step then ran slower
on 2 threads than on one (SmolLM2-135M Q4_1: 21.0 vs 16.5 ms a token, measured). Here the
recorded calls become a *program*: one row of ints per kernel call (its code, the indices of its
arrays in typed lists, its sizes) and one float per call (eps, scale). Every thread runs
`run_step` over the whole program: thread 0 does the serial work (norms, activation quantisation,
attention, the embedding lookup, small products); a large product's row chunks are taken by
every thread from one atomic counter per call, as in cpu_threads. Thread 0 publishes each large
product when its inputs are ready and waits only for chunks a helper has taken, so a helper that
is never scheduled costs nothing; a late helper finds every chunk of the step taken and returns.

`build(entries)` makes the program from a recording's entries, or returns None when an entry is
not one of these kernels or an array is not contiguous (the replay then calls the entries).
"""
import warnings

import numpy as np
from numba import njit
from numba.core import config
from numba.core.errors import NumbaTypeSafetyWarning
from numba.typed import List

from . import cpu_atomics, cpu_decode_kernels, cpu_int_kernels, cpu_kernels
from .cpu_threads import CHUNKS_PER_THREAD

OP_QUANTIZE, OP_PRODUCT, OP_RMS_NORM, OP_LAYER_NORM, OP_ATTENTION, OP_ROWS = range(1, 7)
WIDTH = 24  # ints per program row
WAIT_ROUNDS = 1 << 34  # polls before thread 0 gives up on a helper's chunk (minutes: a hang guard only)


@njit(cache=True, inline="always")
def _wait_at_least(state, i, value, rounds):
    """Poll until state[i] >= value (at most rounds polls); True if it got there."""
    for _ in range(rounds):
        if cpu_atomics._load_acquire(state, i) >= value:
            return True
        cpu_atomics._cpu_relax()
    return False


@njit(cache=True, nogil=True)
def run_step(prog, reals, F, Q, S, U, ID, table, step, state, tid, helper_rounds):
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
        if code == OP_PRODUCT and p[16] > 1:  # a large product: rows in chunks, every thread
            shared_seen += 1
            if tid == 0:
                cpu_atomics._fetch_add(state, pub, 1)
            elif not _wait_at_least(state, pub, shared_seen, helper_rounds):
                return 0  # thread 0 is slow (or gone): it does the rest itself
            m, k, n_out, n_rows, chunks = p[12], p[13], p[14], p[15], p[16]
            qx = Q[p[5]].reshape((m, k))
            dx = F[p[6]].reshape((m, k // 32))
            sx = S[p[7]].reshape((m, k // 32))
            out = F[p[8]].reshape((m, n_out))
            while True:
                c = cpu_atomics._fetch_add(state, 2 * j, 1)
                if c >= chunks:
                    break
                cpu_int_kernels.qmatmul_q(p[1], p[2], p[3], U[p[4]], qx, dx, sx, table, out, F[p[9]], p[10] != 0,
                                          p[11], n_rows * c // chunks, n_rows * (c + 1) // chunks)
                cpu_atomics._fetch_add(state, 2 * j + 1, 1)
                if tid != 0:
                    cpu_atomics._fetch_add(state, pub + 1, 1)
            if tid == 0 and not _wait_at_least(state, 2 * j + 1, chunks, WAIT_ROUNDS):
                return 1
            continue
        if tid != 0:
            continue
        if code == OP_PRODUCT:
            m, k, n_out, n_rows = p[12], p[13], p[14], p[15]
            cpu_int_kernels.qmatmul_q(p[1], p[2], p[3], U[p[4]], Q[p[5]].reshape((m, k)),
                                      F[p[6]].reshape((m, k // 32)), S[p[7]].reshape((m, k // 32)), table,
                                      F[p[8]].reshape((m, n_out)), F[p[9]], p[10] != 0, p[11], 0, n_rows)
        elif code == OP_QUANTIZE:
            m, k = p[2], p[3]
            cpu_int_kernels.quantize_rows(F[p[1]].reshape((m, k)), p[7], Q[p[4]].reshape((m, k)),
                                          F[p[5]].reshape((m, k // 32)), S[p[6]].reshape((m, k // 32)))
        elif code == OP_RMS_NORM:
            m, d = p[6], p[7]
            cpu_decode_kernels.add_rms_norm(F[p[1]].reshape((m, d)), F[p[2]].reshape((m, d)), F[p[3]], reals[j],
                                            F[p[4]].reshape((m, d)), F[p[5]].reshape((m, d)))
        elif code == OP_LAYER_NORM:
            m, d = p[6], p[7]
            cpu_decode_kernels.add_layer_norm(F[p[1]].reshape((m, d)), F[p[2]].reshape((m, d)), F[p[3]], F[p[8]],
                                              reals[j], F[p[4]].reshape((m, d)), F[p[5]].reshape((m, d)))
        elif code == OP_ATTENTION:
            b, h, hk, t, d, dv, cap, rows, w = p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20]
            position = np.int64(step[0])
            cos = F[p[4]].reshape((rows, w))
            sin = F[p[5]].reshape((rows, w))
            if rows:
                at = position + p[6]
                cos, sin = cos[at:at + t], sin[at:at + t]
            cpu_decode_kernels.cache_attention(
                F[p[1]].reshape((b, h, t, d)), F[p[2]].reshape((b, hk, t, d)), F[p[3]].reshape((b, hk, t, dv)),
                cos, sin, F[p[7]].reshape((b, hk, cap, d)), F[p[8]].reshape((b, hk, cap, dv)), position, p[9],
                np.float32(reals[j]), p[10] != 0, F[p[11]].reshape((b, h, t, dv)))
        elif code == OP_ROWS:
            k, n_ids = p[6], p[8]
            cpu_kernels.dequant_rows_blocks(p[1], p[2], p[3], U[p[4]], ID[p[5]], k, table, F[p[7]].reshape((n_ids, k)))
    return 0


class Program:
    """A recording's kernel calls as run_step's program (see the module doc); run() replays them."""

    def __init__(self, rows, reals, lists, step, checks):
        self.prog = np.array(rows, dtype=np.int64).reshape(len(rows), WIDTH)
        self.reals = np.array(reals, dtype=np.float64)
        self.lists = lists  # the typed lists F, Q, S, U, ID
        self.step = step
        self.checks = checks  # (fn, args): the ids and positions a replay checks before the kernels

    def run(self):
        from . import cpu_matmul
        for fn, args in self.checks:
            fn(*args)
        state = self.state = np.zeros(2 * self.prog.shape[0] + 2, dtype=np.int64)
        args = (self.prog, self.reals, *self.lists, cpu_kernels.F16_TABLE, self.step, state)
        pool = cpu_matmul.pool()
        if pool is not None:
            pool.share(run_step, args, _helper_rounds())
        if run_step(*args, 0, 0):
            raise RuntimeError("cpu step: a helper thread never finished its chunk of a product")


HELPER_WAIT_US = 2000  # how long a helper waits for thread 0 to publish the step's next product
_rounds: list[int] = []


def _helper_rounds():
    if not _rounds:
        _rounds.append(cpu_atomics.rounds_for(HELPER_WAIT_US))
    return _rounds[0]


class _Arrays:
    """Arrays of one dtype in a typed list, each once (flat views of the recorded arrays)."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.items = []
        self.index = {}

    def add(self, a):
        if not isinstance(a, np.ndarray) or a.dtype != self.dtype or not a.flags.c_contiguous:
            raise _NotProgram
        key = (a.__array_interface__["data"][0], a.size)
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append(a.reshape(-1))
        return self.index[key]

    def typed(self):
        out = List()
        with warnings.catch_warnings():  # read-only (mapped) weights in a list of writable arrays: only read
            warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
            for a in self.items or [np.empty(0, self.dtype)]:
                out.append(a)
        return out


class _NotProgram(Exception):
    pass


def build(entries):
    """The Program of a recording's (fn, args) entries, or None when one is not a kernel call
    run_step knows or an array is not contiguous; and under NUMBA_DISABLE_JIT=1 (its atomics are
    compiled code)."""
    if config.DISABLE_JIT:
        return None
    from ..backends import cpu_capture
    from . import cpu_matmul
    F, Q, S, U, ID = (_Arrays(t) for t in (np.float32, np.int16, np.int32, np.uint8, np.int64))
    rows: list[list[int]] = []
    reals: list[float] = []
    checks: list[tuple] = []
    step = np.zeros(4, dtype=np.uint32)  # (no attention: nothing reads it)
    threads = cpu_matmul.threads()

    def row(*values):
        rows.append(list(values) + [0] * (WIDTH - len(values)))

    try:
        for fn, args in entries:
            real = 0.0
            if fn is cpu_int_kernels.quantize_rows:
                x, qmax, qx, dx, sx = args
                m, k = x.shape
                row(OP_QUANTIZE, F.add(x), m, k, Q.add(qx), F.add(dx), S.add(sx), qmax)
            elif fn is cpu_matmul.run_product:
                (fmt, bs, bb, raw, qx, dx, sx, _table, out, bias, gated, act), n, shared = args
                m, k = qx.shape
                chunks = min(n, threads * CHUNKS_PER_THREAD) if shared and threads > 1 else 1
                row(OP_PRODUCT, fmt, bs, bb, U.add(raw), Q.add(qx), F.add(dx), S.add(sx), F.add(out), F.add(bias),
                    int(gated), act, m, k, out.shape[1], n, chunks)
            elif fn is cpu_decode_kernels.add_rms_norm:
                x, r, w, real, total, normed = args
                m, d = x.shape
                row(OP_RMS_NORM, F.add(x), F.add(r), F.add(w), F.add(total), F.add(normed), m, d)
            elif fn is cpu_decode_kernels.add_layer_norm:
                x, r, w, bias, real, total, normed = args
                m, d = x.shape
                row(OP_LAYER_NORM, F.add(x), F.add(r), F.add(w), F.add(total), F.add(normed), m, d, F.add(bias))
            elif fn is cpu_capture.cache_attention:
                _kernel, step, rel, q, k, v, cos, sin, kc, vc, key_start, real, interleaved, out = args
                b, h, t, d = q.shape
                _, hk, cap, dv = vc.shape
                row(OP_ATTENTION, F.add(q), F.add(k), F.add(v), F.add(cos), F.add(sin), rel, F.add(kc), F.add(vc),
                    key_start, int(interleaved), F.add(out), b, h, hk, t, d, dv, cap, cos.shape[0], cos.shape[1])
                check = (cpu_capture.check_position, (step, t, cap, rel, cos.shape[0]))
                if check not in checks:  # (the same for every layer)
                    checks.append(check)
            elif fn is cpu_matmul.checked_rows:
                n_rows, (fmt, bs, bb, raw, ids, k, _table, out) = args
                row(OP_ROWS, fmt, bs, bb, U.add(raw), ID.add(ids), k, F.add(out), ids.size)
                checks.append((cpu_matmul.check_ids, (ids, n_rows)))
            else:
                return None
            reals.append(float(real))
    except _NotProgram:
        return None
    return Program(rows, reals, [a.typed() for a in (F, Q, S, U, ID)], step, checks)
