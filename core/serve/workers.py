"""One worker thread per model: blocking model work never runs on the event loop.

A Worker takes Jobs from a bounded queue and runs them one at a time (Whisper). A
BatchWorker (language models) is a continuous-batching scheduler: it takes up to
`max_batch` jobs from the same queue, prefills each new one alone (its prompt), then steps
all running ones together, one token each per step (tallow.generation.step: one
model.decode_batch); a new job joins between two steps and a finished, cancelled or
disconnected one leaves at once. A job reports through `emit`, which hands each event to
the event loop's asyncio queue; `cancel` is the flag checked between tokens (set when the
client disconnects or the request runs out of time).
"""
import asyncio
import os
import queue
import sys
import threading


class Cancelled(Exception):
    """Raised inside a job's function when its cancel flag is seen."""


class Job:
    """fn(job) runs in the worker thread: it calls job.emit(event) as it goes and returns the
    result; the event loop reads ("event", x) ... then ("done", result) or ("error", exception)."""

    def __init__(self, fn, loop, task=None):
        self.fn, self.loop = fn, loop
        self.task = task  # for a BatchWorker: what it steps (see BatchWorker)
        self.cancel = threading.Event()
        self.events = asyncio.Queue()
        self.tokens = 0  # tokens the job generated (counted into its worker's stats)
        self.outcome = None  # "completed", "cancelled" or "failed", once it ran

    def emit(self, event):
        self._put(("event", event))

    def check(self):
        """Raise Cancelled when the job was cancelled (call it between steps)."""
        if self.cancel.is_set():
            raise Cancelled()

    def _put(self, item):
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop has closed: the server is shutting down
            self.cancel.set()

    def run(self):
        """Run fn; the final event to send ("done", result) or ("error", e), or None when the
        job was cancelled before it started. The worker sends it after counting the job, so a
        client that has its answer sees the counts in /health."""
        if self.cancel.is_set():  # the client left while the job waited
            self.outcome = "cancelled"
            return None
        try:
            result = self.fn(self)
        except Cancelled as e:
            self.outcome = "cancelled"
            return ("error", e)
        except Exception as e:  # reported to the request; the worker goes on
            self.outcome = "failed"
            return ("error", e)
        self.outcome = "completed"
        return ("done", result)

    def finish(self, final):
        if final is not None:
            self._put(final)


class Worker:
    """A daemon thread running one model's jobs in order; at most `max_queue` wait."""

    def __init__(self, name, max_queue):
        self.name = name
        self.max_batch = 1
        self._queue = queue.Queue(maxsize=max_queue)
        self.running = False
        self.stats = {"completed": 0, "cancelled": 0, "failed": 0, "tokens": 0}
        self._thread = threading.Thread(target=self._loop, name=f"tallow-serve-{name}", daemon=True)
        self._thread.start()

    def submit(self, job):
        """Queue the job; False when the queue is full."""
        try:
            self._queue.put_nowait(job)
            return True
        except queue.Full:
            return False

    @property
    def waiting(self):
        return self._queue.qsize()

    def _loop(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.running = True
            final = None
            try:
                final = job.run()
            except BaseException as e:  # never lose the worker: report and take the next job
                job.outcome = "failed"
                final = ("error", e)
                print(f"tallow serve: worker {self.name}: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                self.running = False
                self._count(job, final)

    def _count(self, job, final):
        self.stats[job.outcome or "failed"] += 1
        self.stats["tokens"] += job.tokens
        job.finish(final)

    def stop(self):
        """End the thread after the queued jobs (a full queue: it is a daemon and ends with the process)."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass


def _shared(a, b):
    """How many leading ids a and b share (commonprefix compares any two sequences item by item)."""
    return len(os.path.commonprefix([list(a), list(b)]))


class BatchWorker(Worker):
    """Continuous batching for a language model: up to max_batch jobs decode together.

    A job's task has start(cache) (prefill the prompt alone on that cache; False when the
    request is already complete), sequence (its tallow.generation.Sequence), feed(token)
    (report a token, None when the sequence stopped; False when the request is complete:
    raises Cancelled when its cancel flag is set) and result(). The caches are kept between
    requests (their buffers, captured steps and token ids stay): a new request takes the one
    holding the longest prefix of its prompt. stats["peak_batch"]: the most sequences one step
    has decoded together."""

    def __init__(self, name, max_queue, model, max_batch):
        self.model = model
        self._free = []  # caches not in use
        super().__init__(name, max_queue)
        self.max_batch = max_batch
        self.stats["peak_batch"] = 0

    def _loop(self):
        from ..generation import step
        active, stopping = [], False
        while True:
            while len(active) < self.max_batch and not stopping:  # admit: block only when nothing runs
                try:
                    job = self._queue.get(block=not active)
                except queue.Empty:
                    break
                if job is None:  # stop(): the running ones finish, then the thread ends
                    stopping = True
                    break
                self.running = True
                if self._guard(job, self._start, job):
                    active.append(job)
            live = [job for job in active if not job.cancel.is_set() and job.task.sequence.begin()]
            for job in active:
                if job not in live:  # cancelled, or out of room (length / context): leaves now
                    self._guard(job, self._leave, job)
            active = live
            if not active:
                self.running = False
                if stopping:
                    return
                continue
            self.stats["peak_batch"] = max(self.stats["peak_batch"], len(active))
            try:
                tokens = step(self.model, [job.task.sequence for job in active])
            except Exception as e:  # the step failed for all of them: each is told, the worker goes on
                print(f"tallow serve: worker {self.name}: {type(e).__name__}: {e}", file=sys.stderr)
                for job in active:
                    job.outcome = "failed"
                    job.task.sequence.cache = None  # its cache may be half-written: not reused
                    self._count(job, ("error", e))
                active = []
                continue
            active = [job for job, token in zip(active, tokens) if self._guard(job, job.task.feed, token)]

    def _start(self, job):
        return job.task.start(self._cache(job.task.ids))

    @staticmethod
    def _leave(job):
        job.check()  # a cancelled job ends here as cancelled
        return job.task.feed(None)

    def _cache(self, ids):
        """The free cache holding the longest prefix of ids, else a new one."""
        if not self._free:
            return self.model.new_cache()
        best = max(range(len(self._free)), key=lambda i: _shared(self._free[i].token_ids, ids))
        return self._free.pop(best)

    def _guard(self, job, run, arg):
        """run(arg) for a job: True while the job goes on; else it is counted and answered here."""
        if job.cancel.is_set() and job.task.sequence is None:  # the client left while the job waited
            job.outcome = "cancelled"
            self._count(job, None)
            return False
        try:
            if run(arg):
                return True
            job.outcome, final = "completed", ("done", job.task.result())
        except Cancelled as e:
            job.outcome, final = "cancelled", ("error", e)
        except Exception as e:  # reported to the request; the worker goes on (its cache is not reused)
            job.outcome, final = "failed", ("error", e)
        cache = job.task.sequence.cache if job.task.sequence is not None else None
        if job.outcome != "failed" and cache is not None and len(self._free) < self.max_batch:
            self._free.append(cache)
        self._count(job, final)
        return False
