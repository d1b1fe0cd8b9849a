"""A `tallow serve` child process as the serve tests talk to it: started through the installed
entry point on port 0, its URL read from the one line it prints, the official `openai` client
and raw HTTP (for malformed requests) pointed at it. Subclasses say how to stop it."""
import http.client
import re
import subprocess
import threading

import openai
import pytest
from cli_entry import entry_point

HANG_GUARD = 300  # seconds: only so that a broken server fails the test instead of hanging the run


class ServeProcess:
    """`tallow serve --port 0 --device cpu ARGS`; .url and .port once it printed its URL line."""

    def __init__(self, args, log_path, key, env=None, new_session=False):
        self.key = key
        self.final_log = None
        self.log = open(log_path, "w+")
        self.proc = subprocess.Popen([entry_point(), "serve", "--port", "0", "--device", "cpu", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     start_new_session=new_session)

    def wait_for_url(self):
        """The URL line, printed once the models are loaded and the socket listens (None: it never came)."""
        guard = threading.Timer(HANG_GUARD, self.proc.kill)  # a server that never gets ready fails the test
        guard.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            guard.cancel()
        match = re.fullmatch(r"tallow serve: (http://127\.0\.0\.1:(\d+)/)\n", line)
        if match:
            self.url, self.port = match.group(1), int(match.group(2))
        return line, match

    def fail_to_start(self, line):
        self.stop()
        pytest.fail(f"tallow serve printed {line!r}, exit {self.proc.returncode}: {self.stderr()[-3000:]}")

    def stop(self):
        raise NotImplementedError

    def stderr(self):
        if self.log.closed:
            return self.final_log
        self.log.seek(0)
        return self.log.read()

    def client(self, key=None, **kw):
        return openai.OpenAI(base_url=self.url + "v1", api_key=key or self.key, max_retries=0,
                             timeout=HANG_GUARD, **kw)

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes) of one raw HTTP request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HANG_GUARD)
        try:
            conn.request(method, path, body=body,
                         headers={"Authorization": f"Bearer {self.key}", **(headers or {})})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()
