"""Row-range work sharing for the CPU kernels: the calling thread and helper threads take
chunks of a product's output rows from one counter, the kernels running without the GIL.

Why not numba's prange: its OpenMP barrier waits for every thread to arrive. On a box whose
cores other processes share, a helper thread may not be scheduled for a whole time slice,
and a decoding step joins about 90 times a token: measured on a busy 2-core box, 2 prange
threads made decoding 10-30x slower than one. Here the caller keeps taking chunks until none
is left, so a helper that never wakes costs nothing: the caller waits only for chunks a
helper has already started. Between jobs a helper polls briefly before it blocks
(cpu_spin.py), so the next product of the step finds it awake.
"""
import itertools
import queue
import threading

import numpy as np

CHUNKS_PER_THREAD = 2  # a few chunks each, so a late helper leaves its share to the others


class _Job:
    def __init__(self, fn, n_rows, chunks):
        self.fn, self.n_rows, self.chunks = fn, n_rows, chunks
        self.next_chunk = itertools.count()  # next() is atomic under the GIL
        self.finished = itertools.count(1)
        self.done = threading.Event()
        self.error = None

    def work(self):
        """Run chunks until none is left (called by every thread of the pool and the caller)."""
        while True:
            c = next(self.next_chunk)
            if c >= self.chunks:
                return
            try:
                self.fn(self.n_rows * c // self.chunks, self.n_rows * (c + 1) // self.chunks)
            except BaseException as exc:  # raised again in the caller
                self.error = exc
            if next(self.finished) == self.chunks:
                self.done.set()


class RowPool:
    """threads - 1 helper threads (daemons: they hold nothing that needs closing)."""

    def __init__(self, threads, spin_us=None):
        from . import cpu_spin
        self.threads = threads
        self.jobs = queue.SimpleQueue()
        self.posted = np.zeros(1, dtype=np.int64)  # bumped after each job is queued (what helpers poll)
        self.spin_rounds = cpu_spin.rounds_for(cpu_spin.SPIN_US if spin_us is None else spin_us)
        for i in range(threads - 1):
            threading.Thread(target=self._helper, name=f"tallow-cpu-{i + 1}", daemon=True).start()

    def _helper(self):
        from .cpu_spin import spin_while_equal
        while True:
            seen = int(self.posted[0])  # read before looking at the queue: a job queued after this bumps it
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                spin_while_equal(self.posted, seen, self.spin_rounds)  # without the GIL
                job = self.jobs.get()
            if job is None:
                return
            job.work()

    def close(self):
        """Let the helper threads end (after the jobs already queued)."""
        for _ in range(self.threads - 1):
            self.jobs.put(None)

    def run(self, fn, n_rows):
        """fn(start, stop) for row ranges covering range(n_rows), shared among the threads; fn must
        release the GIL (a numba nogil kernel) for the threads to overlap."""
        job = _Job(fn, n_rows, min(n_rows, self.threads * CHUNKS_PER_THREAD))
        if job.chunks == 0:
            return
        for _ in range(self.threads - 1):
            self.jobs.put(job)
        self.posted[0] += 1  # (two callers racing may lose a bump: a polling helper then blocks in get())
        job.work()
        job.done.wait()
        if job.error is not None:
            raise job.error
