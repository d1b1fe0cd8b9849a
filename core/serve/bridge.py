"""The event loop's side of a job: submit it, wait for its events under the request's
deadline, and cancel it when the client leaves or time runs out."""
import asyncio
import contextlib

from .errors import ApiError, busy, timed_out
from .workers import Cancelled, Job

CLIENT_GONE = ApiError(499, "the client closed the request", code="client_closed_request")


def submit(served, fn=None, task=None):
    """Queue fn(job) on the model's worker, or for a language model's BatchWorker the job whose
    task is task(job); 429 when its queue is full."""
    job = Job(fn, asyncio.get_running_loop())
    if task is not None:
        job.task = task(job)
    if not served.worker.submit(job):
        raise busy(f"{served.id} is busy: its queue of waiting requests is full (tallow serve --max-queue); "
                   f"retry shortly")
    return job


async def read_body(request, deadline, timeout):
    """The whole body, within the request's time (the size limit is app.py's)."""
    try:
        return await asyncio.wait_for(request.body(), max(0.0, deadline - asyncio.get_running_loop().time()))
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (tallow serve --request-timeout)",
                       code="request_timeout") from None


class Waiter:
    """async with Waiter(job, ...) as w: await w.next() -> ("event", x) | ("done", result).
    An error in the job is raised here; with `request`, a client disconnect cancels the
    job and raises CLIENT_GONE; past the deadline the job is cancelled and it is a 504."""

    def __init__(self, job, deadline, timeout, request=None):
        self.job, self.deadline, self.timeout, self.request = job, deadline, timeout, request
        self.watch = None

    async def __aenter__(self):
        if self.request is not None:
            self.watch = asyncio.ensure_future(self._watch())
        return self

    async def _watch(self):
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.job.cancel.set()
        self.job.events.put_nowait(("gone", None))

    async def next(self):
        remaining = max(0.0, self.deadline - asyncio.get_running_loop().time())
        try:
            kind, value = await asyncio.wait_for(self.job.events.get(), remaining)
        except asyncio.TimeoutError:
            self.job.cancel.set()
            raise timed_out(self.timeout) from None
        if kind == "gone":
            raise CLIENT_GONE
        if kind == "error":
            if isinstance(value, Cancelled):
                raise CLIENT_GONE
            raise value
        return kind, value

    async def __aexit__(self, *exc):
        if self.watch is not None:
            self.watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watch
        if exc[0] is not None:
            self.job.cancel.set()  # whatever went wrong here, the worker stops at its next check
