"""web/serve.py answered over real HTTP: files only, byte ranges, malformed paths."""
import http.client
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[1] / "web" / "serve.py"
DATA = bytes(range(256)) * 4  # 1024 bytes, every offset distinguishable


def _serve_module():
    spec = importlib.util.spec_from_file_location("tallow_web_serve_test", SERVE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "secret.txt").write_text("outside dist")
    dist = root / "dist"
    (dist / "models" / "tiny").mkdir(parents=True)
    (dist / "index.html").write_text("<p>demo</p>")
    (dist / "models" / "tiny" / "model.gguf").write_bytes(DATA)
    with _serve_module().StaticServer(dist) as s:
        yield s


def request(server, path, method="GET", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


MODEL = "/models/tiny/model.gguf"


def test_files_and_index_are_served_but_folders_are_not_listed(server):
    status, headers, body = request(server, "/")
    assert status == 200 and body == b"<p>demo</p>"
    status, headers, body = request(server, MODEL)
    assert status == 200 and body == DATA and headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Length"] == str(len(DATA))
    for folder in ("/models/", "/models/tiny/"):
        status, _, body = request(server, folder)
        assert status == 404 and b"model.gguf" not in body


def test_every_answer_makes_the_page_cross_origin_isolated(server):
    """COOP same-origin + COEP require-corp on files, ranges, 404s and 304s alike: the page and its
    workers get crossOriginIsolated (the wasm device's threads; tests/test_browser_isolation.py)."""
    answers = [request(server, "/"), request(server, MODEL, headers={"Range": "bytes=0-9"}),
               request(server, "/missing.txt")]
    last_modified = answers[0][1]["Last-Modified"]
    answers.append(request(server, "/", headers={"If-Modified-Since": last_modified}))
    assert [status for status, _, _ in answers] == [200, 206, 404, 304]
    for _, headers, _ in answers:
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"


@pytest.mark.parametrize("spec,first,last", [("bytes=0-0", 0, 0), ("bytes=100-199", 100, 199), ("bytes=1000-", 1000, 1023),
                                             ("bytes=-24", 1000, 1023), ("bytes=1020-5000", 1020, 1023),
                                             ("bytes=-5000", 0, 1023)])
def test_single_range_is_206(server, spec, first, last):
    status, headers, body = request(server, MODEL, headers={"Range": spec})
    assert status == 206 and body == DATA[first:last + 1]
    assert headers["Content-Range"] == f"bytes {first}-{last}/{len(DATA)}"
    assert headers["Content-Length"] == str(last - first + 1)


@pytest.mark.parametrize("spec", ["bytes=1024-", "bytes=5000-6000", "bytes=-0"])
def test_unsatisfiable_range_is_416(server, spec):
    status, headers, body = request(server, MODEL, headers={"Range": spec})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(DATA)}" and body == b""


@pytest.mark.parametrize("spec", ["bytes=0-1,5-6", "items=0-5", "bytes=9-3", "bytes=-"])
def test_ranges_we_do_not_serve_get_the_whole_file(server, spec):
    status, _, body = request(server, MODEL, headers={"Range": spec})
    assert status == 200 and body == DATA


def test_head_sends_headers_only(server):
    status, headers, body = request(server, MODEL, method="HEAD")
    assert status == 200 and headers["Content-Length"] == str(len(DATA)) and body == b""
    status, headers, body = request(server, MODEL, method="HEAD", headers={"Range": "bytes=10-19"})
    assert status == 206 and headers["Content-Range"] == "bytes 10-19/1024" and body == b""


@pytest.mark.parametrize("path", ["/%00", "/models/tiny/model.gguf%00.txt", "/%ed%a0%80.gguf"])
def test_malformed_paths_are_400_without_a_traceback(server, path, capfd):
    status, _, _ = request(server, path)
    assert status == 400
    assert request(server, "/")[0] == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("path", ["/../secret.txt", "/%2e%2e/secret.txt", "/models/../../secret.txt",
                                  "//../secret.txt"])
def test_nothing_outside_dist_is_reachable(server, path):
    status, _, body = request(server, path)
    assert status == 404 and b"outside dist" not in body


@pytest.mark.parametrize("spec,status,body", [
    ("bytes=999999999999999999999999999999-", 416, b""),  # past the end, however long the number
    ("bytes=" + "9" * 5000 + "-", 416, b""),  # past Python's 4,300-digit int() limit
    ("bytes=0-999999999999999999999999999999", 206, DATA),  # to the end
    ("bytes=-99999999999999999999999999999", 206, DATA),  # a suffix longer than the file: all of it (RFC 9110)
])
def test_ranges_with_huge_numbers_are_answered(server, spec, status, body):
    got, _, data = request(server, MODEL, headers={"Range": spec})
    assert (got, data) == (status, body)


def _site(tmp_path):
    (tmp_path / "index.html").write_text("<p>demo</p>")
    return tmp_path


def test_idle_half_sent_requests_are_dropped_and_logged_in_one_line(tmp_path, capfd):
    import socket
    module = _serve_module()
    module._Handler.timeout = 0.5  # the module's own copy: IDLE_SECONDS for this server only
    with module.StaticServer(_site(tmp_path), quiet=False) as s:
        socks = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(5)]
        for sock in socks:
            sock.sendall(b"GET /index.html HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        for sock in socks:
            assert sock.recv(1024) == b""  # the server hung up (the 30 s socket timeout only guards a hang)
            sock.close()
        status, _, body = request(s, "/")  # and still serves
        assert status == 200 and body == b"<p>demo</p>"
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("Request timed out") == 5


def test_connections_over_the_cap_get_503_not_a_thread(tmp_path):
    import socket
    module = _serve_module()
    module.MAX_CONNECTIONS = 3
    with module.StaticServer(_site(tmp_path)) as s:
        held = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(3)]
        for sock in held:
            sock.sendall(b"GET /")  # a request line begun, so each holds a serving thread
        extra = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        extra.sendall(b"GET / HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := extra.recv(1024):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 503")
        for sock in held + [extra]:
            sock.close()
        for _ in range(100):  # the slots come back once the held connections close
            status, _, _ = request(s, "/")
            if status == 200:
                break
        assert status == 200


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_command_line_server_stops_cleanly_on_ctrl_c_and_sigterm(tmp_path, stop):
    """Ctrl-C in a terminal, SIGTERM from a service manager (or where a script's job cannot get SIGINT)."""
    server = subprocess.Popen([sys.executable, str(SERVE), "--port", "0", "--dist", str(_site(tmp_path))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "serving DIST at http://127.0.0.1:N/"
        port = int(line.rsplit(":", 1)[1].strip(" /\n"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
        conn.close()
        server.send_signal(stop)
        assert server.wait(timeout=30) == 0 and "Traceback" not in server.stderr.read()
    finally:
        server.kill() if server.poll() is None else None
        server.stdout.close()
        server.stderr.close()
