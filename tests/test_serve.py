"""`tallow serve` as clients see it: the server runs as a subprocess through the installed
entry point, and the official `openai` package (plus raw HTTP for malformed requests) talks
to it. Outputs are compared with the library's own: greedy chat and completions with
model.chat/generate, transcripts with model.transcribe and the JFK sentence.

Most tests share one server (module scope); the queue-bound and time-limit tests get a second
one with small limits. Nothing here asserts a duration: cancellation is checked by counts (the
tokens the cancelled request generated), and timeouts only guard against hangs."""
import json
import os
import re
import subprocess
import threading
import warnings
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the serve tests need the openai client: pip install -e '.[dev]'")
pytest.importorskip("uvicorn", reason="tallow serve needs the serve extra: pip install -e '.[serve]'")

import tallow  # noqa: E402
from cli_entry import entry_point  # noqa: E402
from serve_process import HANG_GUARD, ServeProcess  # noqa: E402
from tallow.generation import chat_prompt_ids  # noqa: E402

JFK_TEXT = ("And so my fellow Americans ask not what your country can do for you, "
            "ask what you can do for your country.")
KEY = "test-key-1234"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Server(ServeProcess):
    """`tallow serve --port 0 ARGS` until stop(); .url from the line it prints."""

    def __init__(self, args, log_path):
        super().__init__(args, log_path, KEY)
        line, match = self.wait_for_url()
        if not match:
            self.fail_to_start(line)

    def health(self):
        status, _, body = self.request("GET", "/health")
        assert status == 200
        return {m["id"]: m for m in json.loads(body)["models"]}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # uvicorn shuts down on SIGTERM
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.final_log = self.stderr()
        self.log.close()


@pytest.fixture(scope="module")
def server(smollm2_gguf, whisper_tiny_dir, tmp_path_factory):
    uploads = tmp_path_factory.mktemp("uploads")
    s = Server(["--model", f"smollm2={smollm2_gguf}", "--model", f"whisper={whisper_tiny_dir}", "--api-key", KEY,
                "--max-body-mb", "0.25", "--max-upload-mb", "1", "--max-tokens", "1024", "--upload-dir", uploads],
               tmp_path_factory.mktemp("log") / "serve.log")
    s.uploads = uploads
    yield s
    s.stop()
    assert "Traceback" not in s.stderr()


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    """The same model in this process: the reference outputs."""
    return tallow.load_model(str(smollm2_gguf), device="cpu")


@pytest.fixture(scope="module")
def whisper(whisper_tiny_dir):
    return tallow.load_model(str(whisper_tiny_dir), device="cpu")


def error_of(exc_info):
    """The OpenAI error object of a refused request."""
    return exc_info.value.body if "message" in exc_info.value.body else exc_info.value.body["error"]


# ---- chat and completions -------------------------------------------------------------------
def test_models_and_health(server):
    assert sorted(m.id for m in server.client().models.list()) == ["smollm2", "whisper"]
    assert set(server.health()) == {"smollm2", "whisper"}


def test_chat_greedy_equals_the_library(server, llm):
    reply = server.client().chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    alone = llm.chat(QUESTION, max_tokens=24, temperature=0, stream=True)
    expected = alone.text()
    assert reply.choices[0].message.content == expected and "Paris" in expected
    assert reply.choices[0].message.role == "assistant" and reply.object == "chat.completion"
    assert reply.choices[0].finish_reason == alone.finish_reason == "stop"  # the turn ended within 24 tokens
    n_prompt = len(chat_prompt_ids(llm, QUESTION))
    n_reply = len(alone.token_ids)
    assert reply.usage.prompt_tokens == n_prompt and reply.usage.completion_tokens == n_reply
    assert reply.usage.total_tokens == n_prompt + n_reply


def test_streamed_deltas_equal_the_whole_reply(server, llm):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    chunks = list(server.client().chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                                           max_tokens=12, stream=True,
                                                           stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == llm.chat(messages, max_tokens=12, temperature=0)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"  # 12 tokens, cut short
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1


def test_completions_plain_and_streamed(server, llm):
    client = server.client()
    prompt = "The three primary colours are"
    expected = llm.generate(prompt, max_tokens=10, temperature=0)
    done = client.completions.create(model="smollm2", prompt=prompt, max_tokens=10, temperature=0)
    assert done.choices[0].text == expected and done.choices[0].finish_reason == "length"
    assert done.usage.prompt_tokens == len(llm.tokenizer.encode(prompt)) and done.usage.completion_tokens == 10
    pieces = [c.choices[0].text for c in client.completions.create(model="smollm2", prompt=prompt, max_tokens=10,
                                                                   temperature=0, stream=True)]
    assert "".join(pieces) == expected and len(pieces) > 2


def test_stop_strings_and_seeded_sampling_follow_the_library(server, llm):
    client = server.client()
    stopped = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24,
                                             stop=[" Paris"])
    assert stopped.choices[0].message.content == llm.chat(QUESTION, max_tokens=24, temperature=0, stop=[" Paris"])
    assert stopped.choices[0].finish_reason == "stop" and "Paris" not in stopped.choices[0].message.content
    sampled = [client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=1.0, top_p=0.9,
                                              seed=7, max_tokens=12).choices[0].message.content for _ in range(2)]
    assert sampled[0] == sampled[1] == llm.chat(QUESTION, max_tokens=12, temperature=1.0, top_p=0.9, seed=7)


def test_eight_concurrent_streams_are_batched_and_each_get_what_they_get_alone(server, llm):
    """The worker decodes them together (continuous batching: /health's peak_batch counts the
    most sequences one step decoded), and each stream's text is the library's alone."""
    questions = ["What is 2 + 2?", "Name a fruit.", "What colour is the sky?", "Say hello in French.",
                 "Name a planet.", "What is the opposite of hot?", "Count to three.", "Name a colour."]
    results, errors = {}, []
    barrier = threading.Barrier(len(questions))

    def ask(q):
        try:
            barrier.wait(HANG_GUARD)
            stream = server.client().chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=16, stream=True)
            results[q] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    assert not errors and len(results) == len(questions)
    for q in questions:
        assert results[q] == llm.chat([{"role": "user", "content": q}], max_tokens=16, temperature=0), q
    health = server.health()["smollm2"]
    assert health["max_batch"] == 8 and health["peak_batch"] > 1, health


def test_a_client_that_leaves_mid_stream_frees_the_model(server):
    before = server.health()["smollm2"]
    stream = server.client().chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        temperature=0, max_tokens=1000, stream=True)
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 3:
            break
    stream.close()  # the connection closes with the generation far from its 1000 tokens
    reply = server.client().chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
    after = server.health()["smollm2"]
    assert after["cancelled"] == before["cancelled"] + 1 and after["completed"] == before["completed"] + 1
    left_tokens = after["tokens"] - before["tokens"] - 4  # what the cancelled generation made
    assert 3 <= left_tokens < 100, left_tokens


# ---- transcription ----------------------------------------------------------------------------
def words(text):
    return re.findall(r"[a-z']+", text.lower())


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_transcription_in_every_format(server, whisper, jfk_wav, fmt):
    with open(jfk_wav, "rb") as f:
        got = server.client().audio.transcriptions.create(model="whisper", file=f, response_format=fmt)
    if fmt == "json":
        assert got.text == JFK_TEXT
    elif fmt == "text":
        assert got.strip() == JFK_TEXT
    else:  # decoded with timestamps, as `tallow transcribe --format srt` does: the library's own output
        reference = whisper.transcribe(str(jfk_wav), timestamps=True)
        if fmt == "verbose_json":
            assert got.text == reference.text.strip() and got.language == "en" and got.duration == 11.0
            assert [(s.start, s.end, s.text) for s in got.segments] == \
                [(s.start, s.end, s.text) for s in reference.segments]
            assert words(" ".join(s.text for s in got.segments)) == words(JFK_TEXT)
        else:
            assert got == (reference.to_srt() if fmt == "srt" else reference.to_vtt())
            cues = [line for line in got.splitlines() if line and "-->" not in line and not line.isdigit()
                    and line != "WEBVTT"]
            assert words(" ".join(cues)) == words(JFK_TEXT)


def test_translation_with_an_english_only_model_is_the_transcript(server, jfk_wav):
    client = server.client()
    with open(jfk_wav, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the client's own note on the translations API
        assert client.audio.translations.create(model="whisper", file=f).text == JFK_TEXT
    with open(jfk_wav, "rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper", file=f, language="de")
    assert error_of(e)["param"] == "language" and "English-only" in error_of(e)["message"]
    assert os.listdir(server.uploads) == []  # every upload is deleted after its request


# ---- refusals ---------------------------------------------------------------------------------
def test_refusals_through_the_openai_client(server):
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").chat.completions.create(model="smollm2", messages=QUESTION)
    assert error_of(e)["code"] == "invalid_api_key"
    client = server.client()
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert error_of(e)["code"] == "model_not_found" and "smollm2" in error_of(e)["message"]
    with pytest.raises(openai.NotFoundError):  # a speech model is not a chat model
        client.chat.completions.create(model="whisper", messages=QUESTION)
    with pytest.raises(openai.APIStatusError) as e:  # 0.25 MB is the limit
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "word " * 60_000}])
    assert e.value.status_code == 413 and error_of(e)["code"] == "request_too_large"
    with pytest.raises(openai.BadRequestError) as e:  # ~9000 tokens: past the 8192-token window
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hello " * 9000}])
    assert error_of(e)["code"] == "context_length_exceeded" and "8192" in error_of(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:  # fits the window, but not with its reply
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hello " * 7800}],
                                       max_tokens=1000)
    assert error_of(e)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=5000)
    assert error_of(e)["param"] == "max_tokens" and "1024" in error_of(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, n=2)
    assert error_of(e)["param"] == "n"
    with pytest.raises(openai.APIStatusError) as e:  # 1 MB is the upload limit
        client.audio.transcriptions.create(model="whisper", file=("big.wav", b"\0" * (1024 * 1024 + 10)))
    assert e.value.status_code == 413
    with pytest.raises(openai.BadRequestError) as e:  # not audio
        client.audio.transcriptions.create(model="whisper", file=("notes.wav", b"these are not samples"))
    assert e.value.status_code == 400


RAW_CASES = [  # (path, body, content type, status, param or a word of the message)
    ("/v1/chat/completions", b"{not json", "application/json", 400, "JSON"),
    ("/v1/chat/completions", b"[1, 2]", "application/json", 400, "object"),
    ("/v1/chat/completions", b"\xff\xfe", "application/json", 400, "JSON"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": "hi"}', "application/json", 400, "messages"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": []}', "application/json", 400, "messages"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "wizard", "content": "x"}]}',
     "application/json", 400, "messages[0].role"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": 5}]}',
     "application/json", 400, "messages[0].content"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"temperature": "hot"}', "application/json", 400, "temperature"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"temperature": 1e999}', "application/json", 400, "temperature"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"max_tokens": -1}', "application/json", 400, "max_tokens"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"max_tokens": true}', "application/json", 400, "max_tokens"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"stream": "yes"}', "application/json", 400, "stream"),
    ("/v1/chat/completions", b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], '
                             b'"stop": [1, 2]}', "application/json", 400, "stop"),
    ("/v1/chat/completions", b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}',
     "application/json", 400, "model"),
    ("/v1/completions", b'{"model": "smollm2", "prompt": ["a", "b"]}', "application/json", 400, "prompt"),
    ("/v1/completions", b'{"model": "smollm2", "prompt": "x", "seed": 1.5}', "application/json", 400, "seed"),
    ("/v1/audio/transcriptions", b'{"file": "jfk.wav"}', "application/json", 400, "multipart"),
    ("/v1/audio/transcriptions", b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b--\r\n",
     "multipart/form-data; boundary=b", 400, "file"),
    ("/v1/audio/transcriptions", b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nxx",
     "multipart/form-data; boundary=b", 400, "closing boundary"),
]


@pytest.mark.parametrize("path, body, content_type, status, says", RAW_CASES,
                         ids=[f"{c[0].split('/')[-1]}-{i}" for i, c in enumerate(RAW_CASES)])
def test_malformed_requests_get_openai_error_json(server, path, body, content_type, status, says):
    got, headers, raw = server.request("POST", path, body, {"Content-Type": content_type})
    assert got == status and headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert says in (error["param"] or "") or says in error["message"], error


def test_unknown_paths_methods_and_missing_keys_are_error_json(server):
    for method, path, headers, status in [("GET", "/v1/nothing", None, 404), ("GET", "/v1/chat/completions", None, 405),
                                          ("GET", "/v1/models", {"Authorization": "Basic abc"}, 401)]:
        got, _, raw = server.request(method, path, headers=headers)
        assert got == status and set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}
    got, _, raw = server.request("GET", "/health", headers={"Authorization": ""})  # no key needed
    assert got == 200 and json.loads(raw)["status"] == "ok"


# ---- limits on a second server: one waiting request per model, a short time limit -------------
@pytest.fixture(scope="module")
def small_server(smollm2_gguf, tmp_path_factory):
    # one request decodes at a time (--max-batch 1), so a second one waits in the queue of 1
    s = Server(["--model", f"smollm2={smollm2_gguf}", "--max-queue", "1", "--max-batch", "1",
                "--request-timeout", "15", "--max-tokens", "8000"],
               tmp_path_factory.mktemp("log") / "small.log")
    yield s
    s.stop()


def test_a_full_queue_is_429_and_a_slow_request_504(small_server):
    client = small_server.client(key="unused")  # this server has no key: any is accepted
    long = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a long story."}], temperature=0,
                max_tokens=2000)
    running = client.chat.completions.create(stream=True, **long)
    next(iter(running))  # the first chunk: the worker runs it now
    waiting = {}
    queued = threading.Thread(target=lambda: waiting.update(reply=client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=3)))
    queued.start()
    for _ in range(HANG_GUARD * 10):  # until the worker's queue holds it
        if small_server.health()["smollm2"]["waiting"] == 1:
            break
        threading.Event().wait(0.1)
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=3)
    assert error_of(e)["code"] == "rate_limit_exceeded"
    running.close()
    queued.join(HANG_GUARD)
    assert waiting["reply"].choices[0].finish_reason == "length"
    with pytest.raises(openai.APIStatusError) as e:  # counting on for 8000 tokens takes far longer than 15 s
        client.completions.create(model="smollm2", prompt="1, 2, 3, 4, 5, 6,", temperature=0, max_tokens=8000)
    assert e.value.status_code == 504 and error_of(e)["code"] == "request_timeout"
    client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2)  # runs after the cancelled one
    counts = small_server.health()["smollm2"]
    assert counts["cancelled"] == 2 and counts["completed"] == 2 and counts["waiting"] == 0


# ---- the command line -------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    ([], "name the models to serve"),
    (["--model", "x", "--port", "70000"], "70000 is not a TCP port"),
    (["--model", "x", "--upload-dir", "/no/such/folder"], "--upload-dir /no/such/folder: no such folder"),
    (["--model", "x", "--max-tokens", "0"], "--max-tokens: 0 must be >= 1"),
])
def test_bad_command_lines_are_one_line(args, says, tmp_path):
    done = subprocess.run([entry_point(), "serve", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TALLOW_HOME=str(tmp_path)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and says in done.stderr and done.stderr.startswith("tallow serve")


def test_the_systemd_unit_runs_a_command_line_serve_accepts():
    # edge/tallow-serve.service: its ExecStart parses with `tallow serve`'s own options, and it is
    # the LAN set-up the README describes (all interfaces, uploads on disk, the key from the environment).
    import argparse
    import shlex
    from tallow.cli import serve as serve_cli
    unit = (Path(__file__).resolve().parents[1] / "edge" / "tallow-serve.service").read_text()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
    assert exec_start[0].endswith("/tallow") and exec_start[1] == "serve"
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(exec_start[2:])
    assert args.host == "0.0.0.0" and args.model == ["smollm2-135m-instruct", "whisper-tiny.en"]
    assert args.upload_dir.startswith("/var/lib/tallow/") and "--api-key" not in exec_start
    assert re.search(r"^EnvironmentFile=/etc/tallow/serve.env$", unit, re.M)
    assert serve_cli.API_KEY_ENV == "TALLOW_API_KEY"
