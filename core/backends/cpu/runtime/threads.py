"""Row-range work sharing for the CPU kernels: the calling thread and helper threads take
chunks of a product's output rows from one atomic counter, inside one kernel call each,
without the GIL (atomics.py; the waits: polls.py).

Why not numba's prange: its OpenMP barrier waits for every thread to arrive. On a box whose
cores other processes share, a helper thread may not be scheduled for a whole time slice,
and a decoding step joins about 90 times a token: measured on a busy 2-core box, 2 prange
threads made decoding 10-30x slower than one. Here the caller keeps taking chunks until none
is left, so a helper that never wakes costs nothing: the caller waits only for chunks a
helper has already started. Between jobs a helper polls briefly before it blocks, so the
step's next product finds it awake.

A kernel shared this way is a numba nogil function kernel(*args, n_rows, chunks, state)
that takes chunk c from atomics.fetch_add(state, 0, 1) while c < chunks, computes rows
n_rows * c // chunks ... n_rows * (c + 1) // chunks, counts it with fetch_add(state, 1, 1),
and returns True in the thread that finished the last chunk (int_dot.qmatmul_shared).
"""
import queue
import threading

import numpy as np

from . import polls

CHUNKS_PER_THREAD = 2  # a few chunks each, so a late helper leaves its share to the others


class _Job:
    def __init__(self, kernel, args, n_rows, chunks):
        self.kernel, self.args, self.n_rows, self.chunks = kernel, args, n_rows, chunks
        self.state = np.zeros(2, dtype=np.int64)  # [next chunk, chunks finished]
        self.done = threading.Event()
        self.error = None

    def work(self):
        """A helper's share: chunks until none is left; the thread that finishes the last says so."""
        try:
            if self.kernel(*self.args, self.n_rows, self.chunks, self.state):
                self.done.set()
        except BaseException as exc:  # raised again in the caller (its chunk is never counted)
            self.error = exc
            self.done.set()


class _SharedJob:
    """A kernel every helper runs once, coordinating with the caller itself (step_loop.run_step)."""

    def __init__(self, kernel, args):
        self.kernel, self.args = kernel, args

    def work(self):
        self.kernel(*self.args)


class RowPool:
    """threads - 1 helper threads (daemons: they hold nothing that needs closing)."""

    def __init__(self, threads, spin_us=None):
        self.threads = threads
        self.jobs = queue.SimpleQueue()
        self.posted = np.zeros(1, dtype=np.int64)  # bumped after each job is queued (what helpers poll)
        self.spin_rounds = polls.rounds_for(polls.SPIN_US if spin_us is None else spin_us)
        for i in range(threads - 1):
            threading.Thread(target=self._helper, name=f"tallow-cpu-{i + 1}", daemon=True).start()

    def _helper(self):
        while True:
            seen = int(self.posted[0])  # read before looking at the queue: a job queued after this bumps it
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                polls.wait_while_equal(self.posted, 0, seen, self.spin_rounds)  # without the GIL
                job = self.jobs.get()
            if job is None:
                return
            job.work()

    def close(self):
        """Let the helper threads end (after the jobs already queued)."""
        for _ in range(self.threads - 1):
            self.jobs.put(None)

    def share(self, kernel, args, *extra):
        """kernel(*args, 1, *extra) on every helper thread, not waited for: the kernel coordinates
        with the caller's own kernel(*args, 0, ...) through its arguments (step_loop.run_step:
        the caller waits only for the chunks a helper took)."""
        job = _SharedJob(kernel, args + (1,) + extra)
        for _ in range(self.threads - 1):
            self.jobs.put(job)
        self.posted[0] += 1

    def run(self, kernel, args, n_rows):
        """kernel(*args, n_rows, chunks, state) on every thread of the pool (see the module's
        docstring); returns when every chunk of range(n_rows) is done."""
        job = _Job(kernel, args, n_rows, min(n_rows, self.threads * CHUNKS_PER_THREAD))
        if job.chunks == 0:
            return
        for _ in range(self.threads - 1):
            self.jobs.put(job)
        self.posted[0] += 1  # (two callers racing may lose a bump: a polling helper then blocks in get())
        if not kernel(*args, n_rows, job.chunks, job.state):  # a helper finishes the last chunk
            if not polls.wait_until_equal(job.state, 1, job.chunks, self.spin_rounds):
                job.done.wait()
        if job.error is not None:
            raise job.error
