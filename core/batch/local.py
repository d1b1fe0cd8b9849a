"""Batch transcription on this machine: in-process for one worker, else N worker
processes that each load the model once.

At most N jobs are in flight, so when a worker process dies (killed, out of
memory) the jobs that were running then are known: a fresh pool is started and
they run again, each alone (so an innocent file is not blamed for its neighbour).
A job whose worker died MAX_CRASHES times is reported as failed, so a file that
kills its worker cannot stop the batch. The model is checked once here before the
workers start, and a worker that cannot load it ends the batch with a ModelError:
no file could run anyway."""
import concurrent.futures as cf
import contextlib
import multiprocessing
import os

from ..io.atomic_output import remove_abandoned
from .worker import ModelError, Outcome, check_model, load_or_error, load_transcriber

MAX_CRASHES = 2
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_transcriber = None  # the model of this worker process, or the ModelError loading it raised


def _init_worker(settings):
    global _transcriber
    _transcriber = load_or_error(settings)


def _run_job(source, output):
    if isinstance(_transcriber, ModelError):
        raise ModelError(str(_transcriber))  # the driver ends the batch with it
    return _transcriber.run(source, output)


def run_local(jobs, settings, workers=1, on_outcome=None):
    """Outcomes of all jobs (in completion order); on_outcome(outcome) as each finishes."""
    report = on_outcome or (lambda outcome: None)
    outcomes = []

    def finish(outcome):
        outcomes.append(outcome)
        report(outcome)

    if not jobs:
        return outcomes
    if workers == 1:
        transcriber = load_transcriber(settings)
        for job in jobs:
            finish(transcriber.run(job.source, job.output))
        return outcomes

    check_model(settings)
    crashes = {}
    pending = list(jobs)
    with _threads_per_worker(max(1, (os.cpu_count() or 1) // workers)):
        while pending:
            pending = _run_pool(pending, settings, workers, finish, crashes)
    return outcomes


@contextlib.contextmanager
def _threads_per_worker(threads):
    """BLAS threads for the worker processes started meanwhile (they inherit the environment):
    N workers each running all cores' threads fight over them (measured: several times slower).
    A thread count the user set is kept."""
    saved = {var: os.environ.get(var) for var in THREAD_VARIABLES}
    for var in THREAD_VARIABLES:
        os.environ.setdefault(var, str(threads))
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _run_pool(jobs, settings, workers, finish, crashes):
    """Run jobs on one pool; the jobs still to run if the pool broke, else []."""
    interrupted = []  # jobs in flight when the pool broke: their dead writers may have left temporaries
    try:
        return _run_pool_until_broken(jobs, settings, workers, finish, crashes, interrupted)
    finally:
        for job in interrupted:  # the pool is shut down here, so every writer of these jobs is gone
            remove_abandoned(job.output)


def _run_pool_until_broken(jobs, settings, workers, finish, crashes, interrupted):
    queue = list(reversed(jobs))  # pop() takes the next job
    running = {}  # future -> job
    absent = set()  # outputs that did not exist when their job was submitted
    suspect = lambda job: crashes.get(job.source, 0) > 0  # in flight when a worker died: runs alone
    # spawn, not fork: a worker starts clean of the parent's threads and locks.
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                initializer=_init_worker, initargs=(settings,)) as pool:
        try:
            while queue or running:
                while queue and not any(map(suspect, running.values())) and \
                        len(running) < (1 if suspect(queue[-1]) else workers):
                    job = queue.pop()
                    if not os.path.exists(job.output):
                        absent.add(job.output)
                    running[pool.submit(_run_job, job.source, job.output)] = job
                    if suspect(job):
                        break
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    finish(future.result())  # raises BrokenProcessPool when a worker died
                    del running[future]
        except cf.process.BrokenProcessPool:
            retry = []
            for future, job in running.items():
                if future.done() and not future.cancelled() and future.exception() is None:
                    finish(future.result())  # finished before the pool broke
                    continue
                interrupted.append(job)
                if job.output in absent and os.path.exists(job.output):
                    # renamed into place (whole: atomic_output) just before its worker died
                    finish(Outcome(job.source, job.output, "done"))
                    continue
                crashes[job.source] = crashes.get(job.source, 0) + 1
                if crashes[job.source] >= MAX_CRASHES:
                    finish(Outcome(job.source, job.output, "failed",
                                   error=f"a worker process died {MAX_CRASHES} times while transcribing it "
                                         "(out of memory? try fewer --workers)"))
                else:
                    retry.append(job)
            return retry + list(reversed(queue))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return []
