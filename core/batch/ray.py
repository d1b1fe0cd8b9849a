"""Batch transcription on a Ray cluster: a pool of actors, each loading the model
once, fed one job (two paths) at a time. Workers read the inputs and write the
outputs themselves, so the folders must be visible at the same paths on every
node (a shared filesystem); the driver ships only paths and gets back Outcomes.

A killed actor is restarted by Ray and its job retried (max_restarts,
max_task_retries); the worker's skip-if-the-output-exists plus atomic writes mean
a retried job never writes its output twice. Needs `pip install 'tallow[ray]'`."""
from .worker import Outcome
from ..errors import Error

TASK_RETRIES = 3


def import_ray():
    try:
        import ray
    except ImportError:
        raise Error("--ray needs Ray: pip install 'tallow[ray]'") from None
    return ray


def connect(address=None):
    """Join the cluster at `address` ("auto", "ray://host:10001", "host:6379"), or the one
    RAY_ADDRESS names, else start a local one; a driver already connected stays so."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise Error(f"--ray {address or ''}: cannot reach a Ray cluster: {e}".replace("  ", " ")) from None
    return ray


class _Actor:
    """A Ray actor around one Transcriber: the model loads once per actor."""

    def __init__(self, settings):
        from .worker import Transcriber
        self.transcriber = Transcriber(settings)

    def run(self, source, output):
        return self.transcriber.run(source, output)


def run_ray(jobs, settings, workers=None, address=None, on_outcome=None):
    """Outcomes of all jobs (in completion order) on `workers` actors (default: one per CPU)."""
    ray = connect(address)
    report = on_outcome or (lambda outcome: None)
    if not jobs:
        return []
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
    workers = min(workers, len(jobs))
    actor_class = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=TASK_RETRIES)(_Actor)
    actors = [actor_class.remote(settings) for _ in range(workers)]
    idle = list(range(workers))
    outcomes, queue, running = [], list(reversed(jobs)), {}  # running: ref -> (actor index, job)
    try:
        while queue or running:
            while queue and idle:
                i, job = idle.pop(), queue.pop()
                running[actors[i].run.remote(job.source, job.output)] = (i, job)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                i, job = running.pop(ref)
                idle.append(i)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as e:  # retries exhausted: this file keeps killing its worker
                    outcome = Outcome(job.source, job.output, "failed",
                                      error=f"its Ray worker failed {TASK_RETRIES + 1} times ({type(e).__name__})")
                outcomes.append(outcome)
                report(outcome)
    finally:
        for actor in actors:
            ray.kill(actor)
    return outcomes
