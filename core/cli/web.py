"""`tallow web build|serve`: the browser demo (Pyodide + WebGPU) from a source checkout.

    tallow web build [--out DIR]  # assemble a static site (web/dist): Pyodide runtime, tallow wheel, page, models
    tallow web serve [--port P]   # build when needed, then serve web/dist on http://127.0.0.1:P/

The site's sources live in the repository's web/ folder (not in the wheel), so
these commands work from a checkout: `npm ci` in web/ provides the Pyodide
runtime, and `tallow fetch whisper-tiny.en smollm2-135m-instruct` the models.
"""
import importlib.util
import os
import sys

from ..errors import Error
from .args import part_mb, port


def add_arguments(parser):
    parser.add_argument("action", choices=("build", "serve"), help="build web/dist, or build if needed and serve it")
    parser.add_argument("--port", type=port, default=8000, help="port for serve (default 8000; 0 picks a free one)")
    parser.add_argument("--out", "--dist", dest="out", default=None,
                        help="output folder (default web/dist): self-contained, for any static host")
    parser.add_argument("--no-models", action="store_true", help="do not copy models from the tallow cache")
    parser.add_argument("--part-mb", type=part_mb, default=None,
                        help="split model files bigger than this many MB into parts (default 90; at most 100, "
                             "the GitHub Pages file limit; also $TALLOW_WEB_PART_MB)")
    parser.add_argument("--rebuild", action="store_true", help="serve: build even when dist exists")


def web_dir():
    """The checkout's web/ folder: beside the folder the `tallow` package is imported from
    (core/ in a checkout), whatever depth this module sits at inside the package."""
    top = sys.modules[__package__.partition(".")[0]]  # the `tallow` package, already imported (not a layer import)
    package = os.path.dirname(os.path.realpath(top.__file__))  # through links such as a worktree shim
    web = os.path.join(os.path.dirname(package), "web")
    if not os.path.isfile(os.path.join(web, "build.py")):
        raise Error(f"tallow web needs a source checkout: the web/ folder is not part of the wheel "
                    f"(tallow is installed at {package}). Run it from a clone instead: "
                    f"git clone <the tallow repository> && cd tallow && pip install -e . && tallow web serve")
    return web


def _load(name):
    path = os.path.join(web_dir(), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tallow_web_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args):
    build = _load("build")
    dist = args.out or build.DEFAULT_DIST
    try:
        part = int(args.part_mb * build.MB) if args.part_mb is not None else None
        if args.action == "build" or args.rebuild or not build.is_built(dist):
            build.build(dist, models=not args.no_models, part_bytes=part)
    except build.BuildError as e:
        raise Error(str(e)) from None
    if args.action == "build":
        print(f"tallow web build: {dist} is a static site; serve it with any static server "
              f"(python3 -m http.server -d {dist}) or publish it (GitHub Pages)", flush=True)
        return 0
    serve = _load("serve")
    try:
        server = serve.StaticServer(dist, args.port, quiet=False)
    except OSError as e:
        raise Error(f"cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}; choose another --port") from None
    print(f"tallow demo: {server.url}  (open it in Chrome/Edge for WebGPU; Ctrl-C stops)", flush=True)
    server.serve_until_interrupted()
    return 0
