"""The same app as Ray Serve replicas (`tallow serve --ray`): each replica loads the models
itself (nothing loaded is pickled) and serves create_app's routes, limits and key check;
Ray's HTTP proxy spreads the requests over them and streams their answers back.

Ray is imported inside deployment(), so this module imports without it (the CLI's driver,
tallow.cli.serve_ray, says which pip command installs it)."""
from .app import create_app
from .models import ServedModels

REPLICA_HEADER = b"x-tallow-replica"  # which replica answered: the proxy picks one per request
APP_NAME = "tallow"


class Replica:
    """One replica: the models loaded once, in the replica's own process."""

    def __init__(self, specs, load, limits, api_key):
        from ray import serve
        self.name = serve.get_replica_context().replica_id.unique_id
        self.limits, self.api_key = limits, api_key
        self.served = ServedModels.load(specs, **load)  # load: ServedModels.load's options (device, max_queue, ...)

    def __serve_build_asgi_app__(self):  # Ray Serve calls it after __init__, in the replica
        return NameReplica(create_app(self.served, self.limits, self.api_key), self.name)

    def __del__(self):  # Ray calls it when the replica is stopped
        served = getattr(self, "served", None)
        if served is not None:
            served.stop()


class NameReplica:
    """ASGI middleware: every response says which replica made it (REPLICA_HEADER)."""

    def __init__(self, app, name):
        self.app, self.name = app, name.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, self.name)]}
            await send(message)
        await self.app(scope, receive, named)


def deployment(specs, load, limits, api_key, replicas, replica_cpus):
    """The Ray Serve application (to serve.run): `replicas` copies of the app, each asking Ray
    for `replica_cpus` CPUs. A replica takes up to limits.max_requests at once, as one server
    does; the proxy queues at most limits.max_queue more per replica, then answers 503."""
    from ray import serve
    ingress = serve.ingress()(Replica)
    return serve.deployment(
        ingress, name=APP_NAME, num_replicas=replicas, ray_actor_options={"num_cpus": replica_cpus},
        max_ongoing_requests=limits.max_requests, max_queued_requests=limits.max_queue * replicas,
        graceful_shutdown_timeout_s=5, health_check_timeout_s=60,
    ).bind(specs, load, limits, api_key)
