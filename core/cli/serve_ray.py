"""`tallow serve --ray [ADDRESS]`: the same app (tallow.serve.replicas) as Ray Serve replicas
behind Ray's HTTP proxy, on --host/--port. Without ADDRESS (or $RAY_ADDRESS) it starts a
local Ray cluster of its own, never joining one `ray start` left on this node.

Joining follows `tallow transcribe --ray`'s rules (tallow.batch.ray): a dead address is one
error at once, a silent one after --ray-timeout. The models are fetched (or checked) once
here, so a bad --model is one line before any replica starts; each replica then loads them
itself. Ctrl-C or SIGTERM ends it: Serve and the local cluster are shut down (on a joined
cluster only this app is deleted, and Serve too when this command started it)."""
import logging
import math
import os
import re
import signal
import sys
import threading
import time

from ..errors import Error

POLL_S = 0.25


def _imports():
    try:
        import ray
        from ray import serve
        from ..serve.replicas import APP_NAME, deployment
    except ImportError as e:
        raise Error(f"tallow serve --ray needs Ray Serve ({e.name or e} is not installed): "
                    "pip install 'tallow[serve-ray]'") from None
    return ray, serve, APP_NAME, deployment


def _check_models(specs):
    """Fetch known names and check paths in the driver: one clear line for a bad --model, and
    on a local cluster the replicas find the files cached (they load them themselves)."""
    from ..hub import fetch
    from ..serve.models import model_id
    ids = set()
    for spec in specs:
        served_id, source = model_id(spec)
        if served_id in ids:
            raise Error(f"--model {spec!r}: the id {served_id!r} is given twice; name one ID=PATH")
        ids.add(served_id)
        fetch(source)


def _connect(ray, address, timeout):
    from ..batch.ray import _join, _target, probe
    target, named = _target(address)
    if not target:  # a cluster of our own: "local", so a `ray start` cluster on this node is not joined
        ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        return False
    probe(address)
    try:
        _join(ray, address, timeout, named)
    except (ConnectionError, RuntimeError, ValueError) as e:
        # Ray 2.60 joins a token-authenticated cluster (`ray start`'s default) by address only when told to
        hint = "" if os.environ.get("RAY_AUTH_MODE") else \
            "; if the cluster uses token authentication, set RAY_AUTH_MODE=token (the token: ~/.ray/auth_token)"
        raise Error(f"{named}: cannot reach a Ray cluster: {e}{hint}") from None
    return True


def _replicas(ray, wanted, cpus_each):
    """How many replicas fit the cluster's CPUs (each asks Ray for cpus_each): one that could
    not be placed would leave the deployment waiting forever."""
    cpus = ray.cluster_resources().get("CPU", 0)
    fits = math.floor(cpus / cpus_each + 1e-9)
    if fits < 1:
        raise Error(f"the Ray cluster has {cpus:g} CPUs: a replica asking for {cpus_each:g} cannot be placed; "
                    "lower --replica-cpus")
    if wanted > fits:
        print(f"tallow serve: the Ray cluster has {cpus:g} CPUs: {fits} replicas of {cpus_each:g} CPUs, "
              f"not {wanted}", file=sys.stderr, flush=True)
    return min(wanted, fits)


def _until(done, stop):
    """Wait in short slices until done() or a stop signal; True when stopped."""
    while not done():
        if stop.wait(POLL_S):
            return True
    return stop.is_set()


def _failure(serve, name):
    """One line from a failed deployment: the replica's last error line (a tallow error's
    message, not Ray's traceback)."""
    app = serve.status().applications.get(name)
    messages = [app.message] if app is not None else []
    if app is not None:
        messages += [d.message for d in app.deployments.values()]
    lines = [line.strip() for m in messages for line in (m or "").splitlines() if line.strip()]
    errors = [line for line in lines if "Error:" in line or "Error(" in line]
    last = (errors or lines or ["the replicas did not start (see Ray's logs)"])[-1]
    return re.sub(r"^tallow\.errors\.\w+: ", "", last)  # as the CLI prints a tallow error: its message


def _running_proxy_url():
    """The URL of the Serve proxies already running on a joined cluster (None if unknown)."""
    try:
        from ray.serve.context import _get_global_client  # no public API says it (Ray 2.60)
        http = _get_global_client().http_config
        return f"http://{http.host}:{http.port}/"
    except Exception:  # a private API: if it moved, the message above still says what happens
        return None


def run(args, limits, bind, url):
    """Serve until Ctrl-C / SIGTERM. bind(host, port) checks the port is free (and picks one
    for 0) before Ray starts; url(sock) is the address printed once the replicas answer."""
    from ..batch.ray import CONNECT_TIMEOUT_S
    ray, serve, app_name, deployment = _imports()
    _check_models(args.model)
    sock = bind(args.host, args.port)
    port, address = sock.getsockname()[1], url(sock)
    sock.close()  # Ray's proxy binds it; the gap is a few seconds
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its per-step INFO lines; warnings still show
    stop = threading.Event()
    start = time.perf_counter()
    joined = _connect(ray, args.ray or None, args.ray_timeout or CONNECT_TIMEOUT_S)
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    started_serve = False
    try:
        replicas = _replicas(ray, args.replicas, args.replica_cpus)
        started_serve = not serve.status().proxies
        if started_serve:
            serve.start(http_options={"host": args.host, "port": port, "keep_alive_timeout_s": 5},
                        logging_config={"log_level": "WARNING"})
        else:  # its proxies keep the host and port they were started with
            address = _running_proxy_url() or address
            print(f"tallow serve: Serve already runs on this Ray cluster: the app replaces any app named "
                  f"{app_name!r} and answers on its proxies' host and port, not --host/--port",
                  file=sys.stderr, flush=True)
        load = {"device": args.device, "max_queue": args.max_queue, "max_batch": args.max_batch}
        app = deployment(args.model, load, limits, args.api_key, replicas, args.replica_cpus)
        failed = []

        def deploy():
            try:
                serve.run(app, name=app_name, route_prefix="/", logging_config={"log_level": "WARNING"})
            except BaseException as e:  # handed to the main thread
                failed.append(e)
        thread = threading.Thread(target=deploy, name="tallow-serve-deploy", daemon=True)
        thread.start()
        if _until(lambda: not thread.is_alive(), stop):
            return 130
        if failed:
            raise Error(f"the Ray Serve replicas failed to start: {_failure(serve, app_name)}")
        print(f"tallow serve: {replicas} Ray Serve replicas ready in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
        print(f"tallow serve: {address}", flush=True)
        _until(lambda: False, stop)
        return 0
    finally:
        for s, handler in previous.items():  # a second Ctrl-C during the shutdown ends it at once
            signal.signal(s, handler)
        _shut_down(ray, serve, app_name, joined, started_serve)


def _shut_down(ray, serve, app_name, joined, started_serve):
    try:
        if started_serve or not joined:
            serve.shutdown()
        else:
            serve.delete(app_name)
    finally:
        ray.shutdown()
