"""`tallow serve --ray` as clients see it: the installed entry point starts its own local Ray
cluster (Ray's files in a fresh temp folder, so no other Ray user on this machine is joined)
with two replicas of the app behind Ray's HTTP proxy, and the official `openai` package talks
to it. Greedy replies are compared with the library's (model.chat, as each request alone gets
it), every response names the replica that made it (x-tallow-replica), and SIGTERM must leave
none of the processes the server started.

Each replica asks Ray for half a CPU, so both fit on a 1- or 2-core box. Nothing here asserts a
duration: the timeouts only guard against hangs."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

openai = pytest.importorskip("openai", reason="the serve tests need the openai client: pip install -e '.[dev]'")
pytest.importorskip("ray.serve", reason="tallow serve --ray needs Ray Serve: pip install -e '.[serve-ray]'")

import tallow  # noqa: E402
from serve_process import HANG_GUARD, ServeProcess  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and two model loads: 30-60 s on 2 cores

KEY = "ray-key-5678"
QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Name a fruit.", "What colour is the sky?",
             "Say hello in French.", "Name a planet."]


def _stat(pid):
    """(parent pid, start time) of a live process, from /proc; None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (int(fields[1]), fields[19])


def descendants(root):
    """{pid: start time} of the live processes below `root` (Ray's processes, started by the server)."""
    found, parents = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            parents[int(name)] = stat
    for pid, (_, started) in parents.items():
        up = pid
        while up in parents and up > 1:
            up = parents[up][0]
            if up == root:
                found[pid] = started
                break
    return found


def alive(processes):
    """Those of {pid: start time} still running (the same process: a reused pid has another start time)."""
    return {pid: started for pid, started in processes.items() if (_stat(pid) or (None, None))[1] == started}


class RayServer(ServeProcess):
    """`tallow serve --ray ARGS --port 0` in its own session, until stop()."""

    def __init__(self, args, log_path):
        self.ray_dir = tempfile.mkdtemp(prefix="tallow-ray-", dir="/tmp")  # short: Ray puts sockets in it
        self.started = {}
        super().__init__(["--ray", "--no-access-log", *args], log_path, KEY, new_session=True,
                         env={**os.environ, "RAY_TMPDIR": self.ray_dir, "RAY_ADDRESS": ""})
        line, match = self.wait_for_url()  # printed once both replicas answer
        self.started = descendants(self.proc.pid)
        if not match:
            self.fail_to_start(line)

    def health_of_each_replica(self, replicas=2, tries=100):
        """{replica name: its model's /health entry}, asking until every replica has answered once."""
        seen = {}
        for _ in range(tries):
            status, headers, body = self.request("GET", "/health")
            assert status == 200
            seen[headers["x-tallow-replica"]] = json.loads(body)["models"][0]
            if len(seen) == replicas:
                break
        return seen

    def stop(self):
        """SIGTERM to the server alone (as a service manager sends it); its Ray processes must end
        with it. Returns (exit status, the processes it started that are still alive)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=120)
            left = alive(self.started)
            for _ in range(60):  # Ray's workers notice their raylet is gone within a few seconds
                if not left:
                    break
                threading.Event().wait(1)
                left = alive(self.started)
            return rc, left
        finally:
            self.kill()

    def kill(self):
        """Whatever of ours is still running (the server, then what it started), by pid."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in alive(self.started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdout.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    s = RayServer(["--replicas", "2", "--replica-cpus", "0.5", "--model", f"smollm2={smollm2_gguf}",
                   "--api-key", KEY, "--max-tokens", "256", "--max-batch", "4"], tmp_path_factory.mktemp("log") / "serve-ray.log")
    yield s
    if s.proc.poll() is None:
        s.kill()
    s.log.close()


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    """The same model in this process: the reference outputs."""
    return tallow.load_model(str(smollm2_gguf), device="cpu")


def test_both_replicas_load_the_model_and_answer(server):
    replicas = server.health_of_each_replica()
    assert len(replicas) == 2, f"only {sorted(replicas)} answered /health: {server.stderr()[-2000:]}"
    assert all(m["id"] == "smollm2" and m["kind"] == "llm" for m in replicas.values())
    assert all(m["max_batch"] == 4 for m in replicas.values())  # the options reach every replica
    assert [m.id for m in server.client().models.list()] == ["smollm2"]


def test_concurrent_clients_get_what_each_gets_alone(server, llm):
    # 4 threads, 3 requests each: the proxy spreads them over both replicas, and every greedy
    # reply equals the library's for that request alone.
    work = [QUESTIONS[(t + i) % len(QUESTIONS)] for t in range(4) for i in range(3)]
    replies, errors = [], []

    def ask(questions):
        client = server.client()
        try:
            for q in questions:
                raw = client.chat.completions.with_raw_response.create(
                    model="smollm2", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=16)
                replies.append((q, raw.parse().choices[0].message.content, raw.headers["x-tallow-replica"]))
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(work[3 * t:3 * t + 3],)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    assert not errors and len(replies) == 12, errors
    expected = {q: llm.chat([{"role": "user", "content": q}], max_tokens=16, temperature=0) for q in set(work)}
    for q, text, _ in replies:
        assert text == expected[q], q
    assert len({replica for _, _, replica in replies}) == 2, "one replica served every request"
    served = server.health_of_each_replica()
    assert sum(m["completed"] for m in served.values()) >= 12 and all(m["completed"] > 0 for m in served.values())


def test_a_stream_comes_through_the_proxy_as_it_is_made(server, llm):
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    chunks = list(server.client().chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                                           max_tokens=12, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == llm.chat(messages, max_tokens=12,
                                                                                  temperature=0)
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == "length"
    # A client that reads one event and leaves: if the proxy held the answer back until the end,
    # the replica would have generated all 200 tokens before the first event came out.
    before = server.health_of_each_replica()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "max_tokens": 200, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    line = b"\n"
    while line and not line.startswith(b"data: "):  # the first event (b"": the stream ended first)
        line = response.readline()
    conn.close()
    assert json.loads(line[len(b"data: "):])["choices"][0]["delta"]["role"] == "assistant"
    for _ in range(HANG_GUARD):  # until the replica has seen the client leave
        after = server.health_of_each_replica()
        if sum(m["cancelled"] for m in after.values()) > sum(m["cancelled"] for m in before.values()):
            break
        threading.Event().wait(1)
    made = sum(m["tokens"] for m in after.values()) - sum(m["tokens"] for m in before.values())
    assert sum(m["cancelled"] for m in after.values()) == sum(m["cancelled"] for m in before.values()) + 1
    assert made < 100, f"the cancelled stream made {made} of its 200 tokens"


def test_the_api_key_limits_and_errors_are_the_apps(server):
    with pytest.raises(openai.AuthenticationError) as info:
        server.client(key="wrong").models.list()
    assert info.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=257)
    assert info.value.body["code"] == "invalid_value"
    with pytest.raises(openai.NotFoundError) as info:
        server.client().chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}])
    assert info.value.body["code"] == "model_not_found"
    status, headers, body = server.request("POST", "/v1/chat/completions", body=b"{not json",
                                           headers={"Content-Type": "application/json"})
    assert status == 400 and "error" in json.loads(body) and headers["x-tallow-replica"]
    status, _, _ = server.request("GET", "/v1/models", headers={"Authorization": ""})
    assert status == 401


def test_sigterm_stops_serve_and_the_ray_cluster_it_started(server):
    assert len(server.started) >= 4, server.started  # gcs, raylet, the proxy, the replicas, ...
    rc, left = server.stop()
    log = server.stderr()
    assert rc == 0, log[-3000:]
    assert not left, f"processes left running after SIGTERM: {left}"
    assert "Traceback" not in log, log[-3000:]


def test_without_ray_serve_it_says_which_pip_command_to_run():
    code = ("import sys; sys.modules['ray'] = None\n"
            "from tallow.cli import main\n"
            "sys.exit(main(['serve', '--ray', '--model', 'smollm2-135m-instruct']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("tallow serve: error: tallow serve --ray needs Ray Serve (ray is not installed): "
                           "pip install 'tallow[serve-ray]'\n")
