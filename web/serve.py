"""A threaded static server for web/dist with the MIME types the demo needs.

    python web/serve.py [--port 8000] [--dist web/dist]
    tallow web serve [--port P]            # builds first when dist is missing

Serves on 127.0.0.1 only: a loopback origin is a secure context, so browsers
expose WebGPU and the Cache API there without TLS. `requests` (a list of paths)
records what was asked for, so tests can tell a cached model from a download.

Files only: a folder gives its index.html or 404 (no listings). A single byte
range (`Range: bytes=a-b`) is answered 206, so an interrupted model download
resumes; an unsatisfiable one 416. A path with a null byte or undecodable
escapes is a 400, not a traceback; `..` components are dropped (nothing outside
dist is reachable except through links the build put there).

Cross-origin isolated: every answer carries `Cross-Origin-Opener-Policy: same-origin` and
`Cross-Origin-Embedder-Policy: require-corp` (ISOLATION_HEADERS), so the page and its workers
get SharedArrayBuffer and the wasm device can run on several threads (docs/wasm.md "Threads").
require-corp rather than credentialless: the site fetches nothing from another origin (Pyodide,
the wheels, kernels.wasm and the models are all files of dist), and require-corp is the policy
every browser with SharedArrayBuffer knows (Safari has no credentialless). A static host that
cannot send headers gets the same through web/src/isolate.js, a service worker.

Bounded: a connection that sends nothing for IDLE_SECONDS (a half-sent request, an
idle keep-alive) is closed; at most MAX_CONNECTIONS are served at once (the next is
answered 503 and closed); a request that fails is one log line, never a traceback.
"""
import argparse
import email.utils
import functools
import http.server
import os
import re
import signal
import stat
import sys
import threading
import urllib.parse
from http import HTTPStatus

IDLE_SECONDS = 20  # a client that sends nothing for this long is dropped (it holds a thread)
MAX_CONNECTIONS = 64  # a page loads ~15 files at once; far more is a flood, not a browser

# What makes the served page cross-origin isolated (crossOriginIsolated: SharedArrayBuffer, threads).
ISOLATION_HEADERS = (("Cross-Origin-Opener-Policy", "same-origin"), ("Cross-Origin-Embedder-Policy", "require-corp"))

MIME = {
    ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
    ".json": "application/json", ".html": "text/html; charset=utf-8", ".css": "text/css",
    ".py": "text/x-python; charset=utf-8", ".zip": "application/zip", ".whl": "application/zip",
    ".gguf": "application/octet-stream", ".safetensors": "application/octet-stream",
    ".npz": "application/octet-stream", ".wav": "audio/wav",
}


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME}
    timeout = IDLE_SECONDS  # socket timeout: bounds reading the request line, headers and idle keep-alives

    def __init__(self, *args, log=None, quiet=True, **kwargs):
        self._request_log, self._quiet = log, quiet
        super().__init__(*args, **kwargs)

    def end_headers(self):
        # The site changes with every build; model files carry a version tag in their URL instead.
        self.send_header("Cache-Control", "no-cache")
        for name, value in ISOLATION_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self):
        if self._request_log is not None:
            self._request_log.append(self.path)
        super().do_GET()

    def list_directory(self, path):
        self.send_error(HTTPStatus.NOT_FOUND, "Not found (directory listings are off)")
        return None

    def send_head(self):
        """Headers for GET/HEAD; the open file positioned at the first byte to send, or None."""
        self._remaining = None
        try:
            path = self.translate_path(self.path)
            if "\0" in path:
                raise ValueError("null byte")
            os.fsencode(path)  # lone surrogates from %-escapes that are not UTF-8
        except ValueError:
            self.send_error(HTTPStatus.BAD_REQUEST, "Malformed path")
            return None
        if os.path.isdir(path):
            if not urllib.parse.urlsplit(self.path).path.endswith("/"):
                return super().send_head()  # the redirect to "folder/"
            path = os.path.join(path, "index.html")
        if path.endswith("/") or not os.path.isfile(path):  # also refuses fifos and devices, which could hang
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            return self._send_file_head(f, path)
        except BaseException:
            f.close()
            raise

    def _send_file_head(self, f, path):
        fs = os.fstat(f.fileno())
        if not stat.S_ISREG(fs.st_mode):
            f.close()
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        size = fs.st_size
        span = parse_range(self.headers.get("Range"), size)
        if span == UNSATISFIABLE:
            f.close()
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if span is None and self._not_modified(fs):
            f.close()
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self.end_headers()
            return None
        if span is None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Length", str(size))
        else:
            start, end = span
            f.seek(start)
            self._remaining = end - start + 1
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(self._remaining))
        self.send_header("Content-type", self.guess_type(path))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(fs.st_mtime))
        self.end_headers()
        return f

    def _not_modified(self, fs):
        since = self.headers.get("If-Modified-Since")
        if not since or "If-None-Match" in self.headers:
            return False
        try:
            return int(fs.st_mtime) <= email.utils.parsedate_to_datetime(since).timestamp()
        except (TypeError, IndexError, OverflowError, ValueError):
            return False  # ill-formed: ignored, as RFC 9110 says

    def copyfile(self, source, outputfile):
        if self._remaining is None:
            return super().copyfile(source, outputfile)
        left = self._remaining
        while left > 0:
            chunk = source.read(min(left, 1 << 16))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)

    def log_message(self, fmt, *args):
        if not self._quiet:
            super().log_message(fmt, *args)


UNSATISFIABLE = "unsatisfiable"
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")
_MAX_DIGITS = 18  # any longer number is past every file's end (and int() of 4,300+ digits raises)


def _position(digits):
    return int(digits) if len(digits.lstrip("0")) <= _MAX_DIGITS else 1 << 62


def parse_range(header, size):
    """(first, last) byte of a single `Range: bytes=...` header for a file of `size` bytes,
    UNSATISFIABLE, or None to send the whole file (no header, several ranges, or a malformed
    one: RFC 9110 lets a server ignore those)."""
    m = _RANGE.match(header or "")
    if not m or not (m[1] or m[2]):
        return None
    if not m[1]:  # bytes=-N: the last N bytes (all of them when N is longer than the file, RFC 9110 14.1.3)
        n = _position(m[2])
        return UNSATISFIABLE if n == 0 or size == 0 else (max(0, size - n), size - 1)
    first = _position(m[1])
    if m[2] and _position(m[2]) < first:
        return None  # malformed
    if first >= size:
        return UNSATISFIABLE
    return first, min(_position(m[2]) if m[2] else size - 1, size - 1)


class _BoundedServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on concurrent connections and one-line error logs."""
    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, *args, quiet=True, **kwargs):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._quiet = quiet
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            try:  # over the cap: a short answer, then close; no thread is started for it
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        """One line for a request that failed (a client that went away mid-download, a timeout)."""
        kind, error = sys.exc_info()[:2]
        if not self._quiet and kind is not None:
            sys.stderr.write(f"serve: {client_address[0]}: request failed: {kind.__name__}: {error}\n")


class StaticServer:
    """serve(dist) in a background thread: `with StaticServer(dist) as s: s.url`."""

    def __init__(self, dist, port=0, quiet=True):
        self.requests = []
        handler = functools.partial(_Handler, directory=os.fspath(dist), log=self.requests, quiet=quiet)
        self.httpd = _BoundedServer(("127.0.0.1", port), handler, quiet=quiet)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_until_interrupted(self):
        """Serve until Ctrl-C or SIGTERM (the command-line servers; a service manager stops with
        SIGTERM, and a shell script's background job cannot get SIGINT).

        Where the OS allows, both signals are blocked in every thread and this thread takes them
        with sigwait while serve_forever runs in another: a Python-level handler can be lost when
        a request thread recomputes the interpreter's eval breaker just as the signal lands (seen
        under load: the first SIGTERM left the server in select until a second one came)."""
        if not hasattr(signal, "sigwait"):  # Windows: the handler form
            return self._serve_with_handlers()
        stops = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # inherited by the threads below
        try:
            self.start()
            signal.sigwait(stops)
        finally:
            self.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _serve_with_handlers(self):
        def stop(signum, frame):
            raise KeyboardInterrupt
        previous = signal.signal(signal.SIGTERM, stop)
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.httpd.server_close()

    def close(self):
        self.httpd.shutdown() if self._thread else None
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def _port(text):
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return int(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description="serve web/dist")
    parser.add_argument("--port", type=_port, default=8000)
    parser.add_argument("--dist", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist"))
    args = parser.parse_args(argv)
    server = StaticServer(args.dist, args.port, quiet=False)
    print(f"serving {args.dist} at {server.url}", flush=True)
    server.serve_until_interrupted()
    return 0


if __name__ == "__main__":
    sys.exit(main())
