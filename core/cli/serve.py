"""`tallow serve --model NAME ...`: an OpenAI-compatible HTTP server (tallow.serve) for the
models named, loaded once. Binds 127.0.0.1 unless --host says otherwise; prints
"tallow serve: http://HOST:PORT/" on stdout once it accepts requests (--port 0 picks a port)."""
import ipaddress
import os
import socket
import sys

from .args import port, positive_float, positive_int
from ..errors import Error
from ..settings import settings

API_KEY_ENV = "TALLOW_API_KEY"


def add_arguments(parser):
    parser.add_argument("--model", action="append", default=[], metavar="[ID=]NAME_OR_PATH",
                        help="a model to serve (repeatable): a known name (see `tallow fetch --list`), a .gguf "
                             "file or a model folder; ID= sets the id clients send as `model`")
    parser.add_argument("--device", default=None, help="cpu, python, wgpu, ... (default: the best available)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for the LAN, "
                             "with --api-key)")
    parser.add_argument("--port", type=port, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    parser.add_argument("--api-key", default=None,  # else $TALLOW_API_KEY, read in run(): errors are one line there
                        help=f"require 'Authorization: Bearer KEY' on /v1 (default ${API_KEY_ENV}; none: open)")
    parser.add_argument("--max-tokens", type=positive_int, default=2048,
                        help="most new tokens per request, and the default when a request names none (2048)")
    parser.add_argument("--max-body-mb", type=positive_float, default=1.0, help="largest JSON body (default 1 MB)")
    parser.add_argument("--max-upload-mb", type=positive_float, default=200.0,
                        help="largest audio upload (default 200 MB; it streams to --upload-dir, not memory)")
    parser.add_argument("--max-batch", type=positive_int, default=8,
                        help="requests a language model decodes together, one token each per step (default 8; "
                             "1: one at a time)")
    parser.add_argument("--max-queue", type=positive_int, default=16,
                        help="requests that may wait per model while it runs its batch (default 16; more get 429)")
    parser.add_argument("--max-requests", type=positive_int, default=64,
                        help="requests in flight in all, uploads included (default 64; more get 429)")
    parser.add_argument("--request-timeout", type=positive_float, default=600.0,
                        help="seconds a request may take, from its body to its last token (default 600)")
    parser.add_argument("--upload-dir", default=None, help="where uploads are spooled (default: the temp folder)")
    parser.add_argument("--no-access-log", action="store_true", help="do not log one line per request (stderr)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="serve as Ray Serve replicas behind Ray's proxy (pip install 'tallow[serve-ray]'): "
                             "ADDRESS joins a cluster ('auto', host:6379, ray://host:10001; default $RAY_ADDRESS), "
                             "none starts a local one")
    parser.add_argument("--replicas", type=positive_int, default=2,
                        help="with --ray: copies of the app, each loading the models (default 2)")
    parser.add_argument("--replica-cpus", type=positive_float, default=1.0,
                        help="with --ray: CPUs Ray reserves per replica (default 1; 0.5 puts two on one CPU)")
    parser.add_argument("--ray-timeout", type=positive_float, default=None, metavar="SECONDS",
                        help="with --ray ADDRESS: how long to wait for the cluster to answer (default 30)")


def _bind(host, port_number):
    """A listening socket: bound before the models load (a taken port fails at once), listening
    before the URL is printed (so a client that reads it is never refused)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port_number, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise Error(f"cannot listen on {host}:{port_number}: {e.strerror or e}; choose another --host/--port") \
            from None
    return sock


def _url(sock):
    host, bound_port = sock.getsockname()[:2]
    return f"http://[{host}]:{bound_port}/" if ":" in host else f"http://{host}:{bound_port}/"


def _is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


LOGGING = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "tallow serve: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}},
    "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
                "uvicorn.access": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}


def run(args):
    try:
        import uvicorn
        from ..serve.app import MB, Limits, create_app
        from ..serve.models import ServedModels
    except ImportError as e:
        raise Error(f"tallow serve needs the serve extra ({e.name} is not installed): pip install 'tallow[serve]'") \
            from None
    if args.api_key is None:
        args.api_key = settings().api_key
    if not args.model:
        raise Error("name the models to serve, e.g. --model smollm2-135m-instruct --model whisper-tiny.en")
    upload_dir = args.upload_dir or Limits().upload_dir
    if not os.path.isdir(upload_dir):
        raise Error(f"--upload-dir {upload_dir}: no such folder")
    limits = Limits(max_body_bytes=int(args.max_body_mb * MB), max_upload_bytes=int(args.max_upload_mb * MB),
                    max_tokens=args.max_tokens, max_queue=args.max_queue, max_requests=args.max_requests,
                    request_timeout=args.request_timeout, upload_dir=upload_dir)
    if not _is_loopback(args.host) and not args.api_key:
        print(f"tallow serve: warning: listening on {args.host} without --api-key: anyone who can reach this port "
              "can use it", file=sys.stderr, flush=True)
    if args.ray is not None:
        from .serve_ray import run as run_ray
        return run_ray(args, limits, _bind, _url)
    sock = _bind(args.host, args.port)
    log = lambda line: print(f"tallow serve: {line}", file=sys.stderr, flush=True)
    served = ServedModels.load(args.model, device=args.device, max_queue=args.max_queue, log=log,
                               max_batch=args.max_batch)
    config = uvicorn.Config(create_app(served, limits, args.api_key), log_config=LOGGING,
                            access_log=not args.no_access_log, lifespan="off", timeout_keep_alive=5,
                            timeout_graceful_shutdown=5)
    sock.listen(128)
    print(f"tallow serve: {_url(sock)}", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        served.stop()
    return 0
