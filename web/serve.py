"""A threaded static server for web/dist with the MIME types the demo needs.

    python web/serve.py [--port 8000] [--dist web/dist]
    tallow web serve [--port P]            # builds first when dist is missing

Serves on 127.0.0.1 only: a loopback origin is a secure context, so browsers
expose WebGPU and the Cache API there without TLS. `requests` (a list of paths)
records what was asked for, so tests can tell a cached model from a download.
"""
import argparse
import functools
import http.server
import os
import sys
import threading

MIME = {
    ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
    ".json": "application/json", ".html": "text/html; charset=utf-8", ".css": "text/css",
    ".py": "text/x-python; charset=utf-8", ".zip": "application/zip", ".whl": "application/zip",
    ".gguf": "application/octet-stream", ".safetensors": "application/octet-stream",
    ".npz": "application/octet-stream", ".wav": "audio/wav",
}


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME}

    def __init__(self, *args, log=None, quiet=True, **kwargs):
        self._request_log, self._quiet = log, quiet
        super().__init__(*args, **kwargs)

    def end_headers(self):
        # The site changes with every build; model files carry a version tag in their URL instead.
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def do_GET(self):
        if self._request_log is not None:
            self._request_log.append(self.path)
        super().do_GET()

    def log_message(self, fmt, *args):
        if not self._quiet:
            super().log_message(fmt, *args)


class StaticServer:
    """serve(dist) in a background thread: `with StaticServer(dist) as s: s.url`."""

    def __init__(self, dist, port=0, quiet=True):
        self.requests = []
        handler = functools.partial(_Handler, directory=os.fspath(dist), log=self.requests, quiet=quiet)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self.httpd.serve_forever()

    def close(self):
        self.httpd.shutdown() if self._thread else None
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description="serve web/dist")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dist", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist"))
    args = parser.parse_args(argv)
    server = StaticServer(args.dist, args.port, quiet=False)
    print(f"serving {args.dist} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
