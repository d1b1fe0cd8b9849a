"""One worker thread per model: blocking model work never runs on the event loop.

A Worker takes Jobs from a bounded queue and runs them one at a time (the model holds
one sequence at a time until batched decoding exists; a batching scheduler would take
several jobs from the same queue and step them together, with the same Job interface).
A job's function runs in the worker thread and reports through `emit`, which hands each
event to the event loop's asyncio queue; `cancel` is the flag the function checks
between tokens (set when the client disconnects or the request runs out of time).
"""
import asyncio
import queue
import sys
import threading


class Cancelled(Exception):
    """Raised inside a job's function when its cancel flag is seen."""


class Job:
    """fn(job) runs in the worker thread: it calls job.emit(event) as it goes and returns the
    result; the event loop reads ("event", x) ... then ("done", result) or ("error", exception)."""

    def __init__(self, fn, loop):
        self.fn, self.loop = fn, loop
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
                self.stats[job.outcome or "failed"] += 1
                self.stats["tokens"] += job.tokens
                job.finish(final)

    def stop(self):
        """End the thread after the queued jobs (a full queue: it is a daemon and ends with the process)."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
