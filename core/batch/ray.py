"""Batch transcription on a Ray cluster: a pool of actors, each loading the model
once, fed one job (two paths) at a time. Workers read the inputs and write the
outputs themselves, so the folders must be visible at the same paths on every
node (a shared filesystem); the driver ships only paths and gets back Outcomes.

A killed actor is restarted by Ray and its job retried (max_restarts,
max_task_retries); the worker's skip-if-the-output-exists plus atomic writes mean
a retried job never writes its output twice. Needs `pip install 'tallow[ray]'`.

The model is checked once in the driver before any actor starts, and an actor that
cannot load it ends the batch (a ModelError), never a restart per file. Joining a
cluster is bounded: an address where nothing listens is refused at once, and one
that does not answer as Ray within `timeout` seconds is an error; Ray waits in a
thread meanwhile, so Ctrl-C and SIGTERM end the driver at once."""
import logging
import os
import socket
import sys
import threading

from .worker import ModelError, Outcome, check_model, load_or_error
from ..errors import Error

TASK_RETRIES = 3
CONNECT_TIMEOUT_S = 30  # joining a running cluster takes seconds
PROBE_TIMEOUT_S = 5  # a TCP connect to the cluster's port, before Ray's own minutes of retries


def import_ray():
    try:
        import ray
    except ImportError:
        raise Error("--ray needs Ray: pip install 'tallow[ray]'") from None
    return ray


def connect(address=None, timeout=CONNECT_TIMEOUT_S):
    """Join the cluster at `address` ("auto", "ray://host:10001", "host:6379"), or the one
    RAY_ADDRESS names, else start a local one; a driver already connected stays so."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target, named = _target(address)
    try:
        if not target:  # a new local cluster: nothing to wait for but our own processes
            ray.init(include_dashboard=False, log_to_driver=False)
            return ray
        probe(address)
        _join(ray, address, timeout, named)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise Error(f"{named}: cannot reach a Ray cluster: {e}") from None
    return ray


def _target(address):
    """The address Ray would join (None: it starts a local cluster), and how to name it in errors."""
    target = address or os.environ.get("RAY_ADDRESS")
    return target, f"--ray {address}" if address else (f"RAY_ADDRESS={target}" if target else "--ray")


def probe(address):
    """A TCP connect to the cluster's host:port: refused or silent is one error now, where Ray
    would retry for minutes (measured: > 3 min for 127.0.0.1:1, deaf to Ctrl-C). "auto" (the
    cluster `ray start` left on this node) and a new local cluster have nothing to probe."""
    target, named = _target(address)
    if not target or target == "auto":
        return
    hostport = target.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # Ray parses and refuses what it cannot use
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except socket.gaierror as e:
        raise Error(f"{named}: cannot resolve the host {host}: {e.strerror or e}") from None
    except TimeoutError:
        raise Error(f"{named}: nothing answered at {host}:{port} within {PROBE_TIMEOUT_S} s; "
                    "check the address and that the cluster is up (`ray status` on its head node)") from None
    except OSError as e:
        raise Error(f"{named}: no Ray cluster at {host}:{port} ({e.strerror or e}); start one there with "
                    "`ray start --head`, or give the address `ray start` printed") from None


def _join(ray, address, timeout, named):
    """ray.init in a thread, waited for in short slices: Ray's connect loop blocks in C++ for
    minutes where nothing answers, and the main thread stays free to take Ctrl-C / SIGTERM."""
    failure = []

    def init():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    quiet = logging.getLogger("ray._private.worker")  # its "not the main thread" and "connecting" notes
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        thread = threading.Thread(target=init, name="tallow-ray-connect", daemon=True)
        thread.start()
        waited = 0.0
        while thread.is_alive() and waited < timeout:
            thread.join(0.25)
            waited += 0.25
    finally:
        quiet.setLevel(level)
    if thread.is_alive():
        raise Error(f"{named}: the Ray cluster did not answer within {timeout:g} s; check the address "
                    "(`ray status` on its head node), or wait longer with --ray-timeout")
    if failure:
        raise failure[0]


class _Actor:
    """A Ray actor around one Transcriber: the model loads once per actor."""

    def __init__(self, settings):
        self.transcriber = load_or_error(settings)  # raising here would restart the actor, endlessly

    def run(self, source, output):
        if isinstance(self.transcriber, ModelError):
            raise ModelError(str(self.transcriber))  # not retried (an application error): ends the batch
        return self.transcriber.run(source, output)


def run_ray(jobs, settings, workers=None, address=None, on_outcome=None, timeout=CONNECT_TIMEOUT_S):
    """Outcomes of all jobs (in completion order) on `workers` actors (default: one per CPU).
    timeout: seconds to wait for the cluster at `address` to answer."""
    report = on_outcome or (lambda outcome: None)
    if not jobs:
        return []
    if not import_ray().is_initialized():
        probe(address)  # a dead address is refused before the model loads
    check_model(settings)
    ray = connect(address, timeout)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if workers is not None and workers > cpus:
        # Each actor holds a CPU until the batch ends: one that cannot be placed would never run its files.
        print(f"tallow: the Ray cluster has {cpus} CPUs: using {cpus} workers, not {workers}", file=sys.stderr)
    workers = min(workers or cpus, cpus, len(jobs))
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
                    if isinstance(getattr(e, "cause", None), ModelError):  # the actor has no model
                        raise ModelError(str(e.cause)) from None
                    outcome = Outcome(job.source, job.output, "failed",
                                      error=f"its Ray worker failed {TASK_RETRIES + 1} times ({type(e).__name__})")
                outcomes.append(outcome)
                report(outcome)
    finally:
        for actor in actors:
            ray.kill(actor)
    return outcomes

