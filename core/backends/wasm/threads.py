"""The wasm device on several threads (issue 31 item 4; docs/wasm.md "Threads"): one call list
(program.py) cut into one program per thread, each run by `run` in its own instance of
kernels_mt.wasm over one shared memory.

The cut is made here, on the host, once per recorded program, so the kernels stay the one-thread
kernels: a call whose rows can be shared out (`split`) becomes one call per thread over its share
of the rows (addresses and counts moved, each thread's own scratch), and every other call runs on
thread 0 alone. A barrier (threads_ir's, the program op `barrier`) stands before a shared call when
thread 0 ran calls since the last barrier, and after every shared call, in every thread's program,
so a call reads only what the calls before it finished writing. Every output element of a shared
call is computed by the same code on the same values as without threads: the shares are whole
weight-row panels (GEMMs: 8 rows) or whole activation tiles (block products: 4 rows), so the
result is bit for bit the one-thread result (tests/test_wasm_threads.py).

What is shared (the work of a decode step and of a prompt or Whisper's encoder):
  matmul_<fmt>   one activation row (decode): the weight rows; several: the activation rows, by tiles
  gemm_f32, gemm_f16, gemm_q   the weight rows (C's columns), by panels of 8
  softmax_rows, layer_norm_rows   the rows
Standard library only (the page's driver uses it).
"""
from .program import GEMM_NR, StepArg

BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34, "q4_k": 144, "q5_k": 176, "q6_k": 210}
BLOCK_VALUES = {f: 256 if f.endswith("_k") else 32 for f in BLOCK_BYTES}
FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")  # gemm_q's fmt (codes.FORMATS)
TILE = 4  # matmul_<fmt>'s activation rows a tile (kernels_ir.TILE)
MIN_ROWS = 16  # a call with fewer rows to share is not worth a barrier: it runs on thread 0
MIN_WORK = 1 << 15  # nor is one of fewer multiply-adds (rows x inner length) than this
BARRIER_BYTES = 12  # threads_ir's words: arrivals, generation, abort


def _moved(value, delta):
    """An address argument moved by delta bytes (a StepArg keeps its stride and slot)."""
    if isinstance(value, StepArg):
        return StepArg(value.base + delta, value.stride, value.slot)
    return value + delta


def _shares(total, parts, unit):
    """[(first, count)] of `total` rows in at most `parts` pieces, every first a multiple of unit."""
    units = -(-total // unit)
    out, first = [], 0
    for t in range(parts):
        take = units // parts + (1 if t < units % parts else 0)
        count = min(take * unit, total - first)
        out.append((first, max(count, 0)))
        first += max(count, 0)
    return out


def split(kernel, args, parts, scratch):
    """The calls [(kernel, args) or None] of each of `parts` threads that together do the call
    (kernel, args), or None when it is not shared (it then runs on thread 0). `scratch(t, nbytes)`
    is the address of thread t's own scratch (t >= 1; thread 0 keeps the call's own)."""
    a = list(args)
    if any(isinstance(v, StepArg) for v in _counts(kernel, a)):
        return None  # a count that moves with the step cannot be cut on the host
    if kernel.startswith("matmul_"):
        fmt = kernel[len("matmul_"):]
        raw, n, blocks, m, qx, dx, sx, table, out = a
        k = blocks * BLOCK_VALUES[fmt]
        if m * n * k < MIN_WORK:
            return None
        if m == 1:  # decode: share the weight rows (the kernel takes them in pairs: shares are even)
            if n < MIN_ROWS:
                return None
            return [None if c == 0 else (kernel, [_moved(raw, r0 * blocks * BLOCK_BYTES[fmt]), c, blocks, 1, qx, dx,
                                                  sx, table, _moved(out, r0 * 4)])
                    for r0, c in _shares(n, parts, 2)]
        if m < 2 * TILE:
            return None
        kb = k // 32  # the activations' scales and sums: one per 32 values
        return [None if c == 0 else (kernel, [raw, n, blocks, c, _moved(qx, i0 * k * 2), _moved(dx, i0 * kb * 4),
                                              _moved(sx, i0 * kb * 4), table, _moved(out, i0 * n * 4)])
                for i0, c in _shares(m, parts, TILE)]
    if kernel in ("gemm_f32", "gemm_f16", "gemm_q"):
        if kernel == "gemm_q":
            fmt, aa, lda, raw, blocks, bias, out, ldc, m, n, table, scr = a
            k = blocks * BLOCK_VALUES[FORMATS[fmt]]
            row_bytes, floats = blocks * BLOCK_BYTES[FORMATS[fmt]], 2 * GEMM_NR * k
        else:
            aa, lda, w, ldb, bias, out, ldc, m, n, k, scr = a
            row_bytes, floats = ldb * (4 if kernel == "gemm_f32" else 2), GEMM_NR * k
        if n < 2 * GEMM_NR or m * n * k < MIN_WORK:
            return None
        calls = []
        for t, (j0, c) in enumerate(_shares(n, parts, GEMM_NR)):
            if c == 0:
                calls.append(None)
                continue
            own = scr if t == 0 else scratch(t, floats * 4)
            b0 = _moved(bias, j0 * 4) if bias else bias
            if kernel == "gemm_q":
                calls.append((kernel, [fmt, aa, lda, _moved(raw, j0 * row_bytes), blocks, b0, _moved(out, j0 * 4), ldc,
                                       m, c, table, own]))
            else:
                calls.append((kernel, [aa, lda, _moved(w, j0 * row_bytes), ldb, b0, _moved(out, j0 * 4), ldc, m, c, k,
                                       own]))
        return calls
    if kernel == "softmax_rows":
        x, rows, n, ld, scale, causal, out = a
        if rows < MIN_ROWS or rows * n < MIN_WORK // 8:
            return None
        return [None if c == 0 else (kernel, [_moved(x, r0 * ld * 4), c, n, ld, scale,
                                              causal + r0 if causal >= 0 else causal, _moved(out, r0 * n * 4)])
                for r0, c in _shares(rows, parts, 1)]
    if kernel == "layer_norm_rows":
        x, rows, d, w, bias, eps, out = a
        if rows < MIN_ROWS or rows * d < MIN_WORK // 8:
            return None
        return [None if c == 0 else (kernel, [_moved(x, r0 * d * 4), c, d, w, bias, eps, _moved(out, r0 * d * 4)])
                for r0, c in _shares(rows, parts, 1)]
    return None


def _counts(kernel, a):
    """The arguments split() reads as counts (a StepArg among them: not shared)."""
    if kernel.startswith("matmul_"):
        return [a[1], a[2], a[3]]
    if kernel in ("gemm_f32", "gemm_f16"):
        return [a[1], a[3], a[4], a[7], a[8], a[9]]
    if kernel == "gemm_q":
        return [a[0], a[4], a[5], a[8], a[9]]
    if kernel == "softmax_rows":
        return [a[1], a[2], a[3], a[5]]
    if kernel == "layer_norm_rows":
        return [a[1], a[2], a[4]]
    return []


def plan(calls, parts, barrier, scratch):
    """The per-thread call lists for the resolved calls [(kernel, args)] on `parts` threads, with
    barriers (`barrier`: the address of the barrier's words), or None when no call is shared (the
    one-thread program then does it all on thread 0)."""
    lists = [[] for _ in range(parts)]
    fence = ("barrier", [barrier, parts])
    serial = False  # thread 0 ran calls since the last barrier
    shared = False
    for kernel, args in calls:
        cut = split(kernel, args, parts, scratch) if parts > 1 else None
        if cut is None:
            lists[0].append((kernel, args))
            serial = True
            continue
        shared = True
        if serial:
            for calls_t in lists:
                calls_t.append(fence)
        for calls_t, call in zip(lists, cut):
            if call is not None:
                calls_t.append(call)
            calls_t.append(fence)
        serial = False
    return lists if shared else None


def segments(lists):
    """The per-thread lists as one call list without barriers, each stretch between two barriers
    thread by thread: what the threads compute, in an order one thread may run it (the threads of a
    stretch write disjoint outputs and read what earlier stretches wrote). For tests."""
    cuts = [[[]] for _ in lists]
    for calls_t, out in zip(lists, cuts):
        for call in calls_t:
            if call[0] == "barrier":
                out.append([])
            else:
                out[-1].append(call)
    if len({len(c) for c in cuts}) != 1:
        raise AssertionError("the threads' programs have different barrier counts")
    return [call for stretch in zip(*cuts) for part in stretch for call in part]


class ThreadedPrograms:
    """WasmDriver's record/replay/launch on `threads` threads, for a driver whose memory is shared by
    that many instances of kernels_mt.wasm: a mixin before WasmDriver. The subclass sets `threads`
    and `barrier_at` (the barrier's words) and gives _run_threads(table_at): run the programs whose
    (address, call count) pairs are at table_at, one per thread, thread 0 in this thread, and
    return when all are done. With threads == 1 it is WasmDriver unchanged."""
    threads = 1
    barrier_at = None

    def _thread_scratch(self, t, nbytes, keep):
        own = getattr(self, "_scratches", None)
        if own is None:
            own = self._scratches = {}
        buf = own.get(t)
        if buf is None or buf.nbytes < nbytes:
            buf = own[t] = self.alloc_bytes(nbytes)
        keep.append(buf)
        return buf.at

    def record(self, entries):
        if self.threads <= 1:
            return super().record(entries)
        from array import array

        from .driver import _Program
        from .program import encode
        keep, calls = [], []
        for entry in entries:
            if entry[0] != "call":
                return super().record(entries)  # (its error)
            calls.append((entry[1], self._resolved(entry[1], entry[2], keep)))
        lists = plan(calls, self.threads, self.barrier_at, lambda t, nbytes: self._thread_scratch(t, nbytes, keep))
        if lists is None:
            words, count = encode(calls)
            return _Program(self.upload(words.tobytes(), None), count, keep)
        table = array("i")
        for calls_t in lists:
            words, count = encode(calls_t)
            program = self.upload(words.tobytes(), None)
            keep.append(program)
            table.extend((program.at, count))
        return _Threaded(self.upload(table.tobytes(), None), keep)

    def replay(self, handle):
        if isinstance(handle, _Threaded):
            self._run_threads(handle.table.at)
            self.threaded_runs = getattr(self, "threaded_runs", 0) + 1
        else:
            super().replay(handle)

    def launch(self, kernel, args):
        if self.threads > 1 and kernel in SHARED:
            self.replay(self.record([("call", kernel, list(args))]))
        else:
            super().launch(kernel, args)


SHARED = {f"matmul_{f}" for f in BLOCK_BYTES} | {"gemm_f32", "gemm_f16", "gemm_q", "softmax_rows", "layer_norm_rows"}


class _Threaded:
    """A recorded step on several threads: the table of its per-thread programs, and what it names."""
    __slots__ = ("table", "keep")

    def __init__(self, table, keep):
        self.table, self.keep = table, keep
