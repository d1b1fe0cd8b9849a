"""bench/serve.py: its statistics, stream parsing, token counting and prompt cutting against
references (numpy's percentile, hand-made event streams, tallow's tokenizer), its server
handling (a server that dies or never gets ready is an error and is always killed), and one real
short run of its tallow side (1 and 2 clients, 8 new tokens) checking the output's shape and
counts. No timings are asserted; timeouts only guard against hangs."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "serve.py"
HANG_GUARD = 600  # seconds


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_percentile_matches_numpy(bench):
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 7, 8, 25):
        values = rng.random(n).tolist()
        for q in (0, 5, 50, 95, 100):
            assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)
    assert bench.percentile([], 50) is None


def test_sse_events_from_lines(bench):
    parser = bench.SSE()
    lines = [": ping - 2026-12-06", "", "data: {\"a\": 1}", "", "event: message", "data:{\"b\": 2}", "",
             "data: first", "data: second", "", "", "data: [DONE]", ""]
    got = [d for d in (parser.feed(line) for line in lines) if d is not None]
    assert got == ['{"a": 1}', '{"b": 2}', "first\nsecond", "[DONE]"]


def _completion(text, finish=None):
    return json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def _chat(delta, finish=None):
    return json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                       "finish_reason": finish}]})


def test_stream_timings_and_counts_completions(bench):
    s = bench.Stream(sent=10.0)
    assert not s.event(_completion(""), 10.5)  # no text yet: not the first token
    assert not s.event(_completion("Hello"), 11.0)
    assert not s.event(_completion(" world", "length"), 11.5)
    assert not s.event(json.dumps({"choices": [], "usage": {"prompt_tokens": 64, "completion_tokens": 7}}), 11.6)
    assert s.event("[DONE]", 11.7)
    assert (s.first, "".join(s.text), s.finish_reason) == (11.0, "Hello world", "length")
    assert s.tokens(64, len) == (7, "usage")  # usage first, when the server streamed it
    s.usage = None
    assert s.tokens(64, len) == (64, "length")  # stopped at the limit: exactly max_tokens
    s.finish_reason = "stop"
    assert s.tokens(64, len) == (len("Hello world"), "text")  # stopped early: the text re-counted


def test_stream_chat_chunks_and_errors(bench):
    s = bench.Stream(sent=0.0)
    s.event(_chat({"role": "assistant", "content": ""}), 1.0)  # the role chunk carries no text
    s.event(_chat({"content": "Hi"}), 2.0)
    s.event(_chat({}, "stop"), 3.0)
    assert (s.first, s.text, s.finish_reason) == (2.0, ["Hi"], "stop")
    with pytest.raises(RuntimeError, match="error in the stream"):
        s.event(json.dumps({"error": {"message": "boom"}}), 4.0)


def _stream(bench, sent, first, done, finish="length", usage=None):
    s = bench.Stream(sent)
    s.first, s.done, s.finish_reason, s.usage = first, done, finish, usage
    s.text = ["some words here"]
    return s


def test_round_figures(bench):
    streams = [_stream(bench, 1.0, 1.5, 5.0), _stream(bench, 1.2, 3.0, 9.0),
               _stream(bench, 1.1, 2.0, 7.0, finish="stop")]
    row = bench.round_figures(streams, 64, lambda text: len(text.split()))
    assert row["tokens"] == 64 + 64 + 3
    assert row["wall_s"] == pytest.approx(8.0)  # first sent 1.0 to last done 9.0
    assert row["tok_s"] == pytest.approx(131 / 8.0)
    assert row["ttft_p50"] == pytest.approx(float(np.percentile([0.5, 1.8, 0.9], 50)))
    assert row["ttft_p95"] == pytest.approx(float(np.percentile([0.5, 1.8, 0.9], 95)))
    assert row["early"] == 1 and row["counted_by"] == ["length", "text"]


def test_make_prompts_exact_lengths(bench):
    prompts = bench.make_prompts(lambda t: t.split(), 30, 50)  # words as tokens
    assert len(prompts) == len(set(prompts)) == 30
    assert all(len(p.split()) == 50 for p in prompts)
    assert len({p.split()[0] for p in prompts}) == 30  # distinct first words: no shared prefix to reuse
    with pytest.raises(RuntimeError, match="fewer rounds"):
        bench.make_prompts(lambda t: t.split(), 1000, 50)


def test_make_prompts_with_the_model_tokenizer(bench, smollm2_gguf):
    import tallow
    tok = tallow.Tokenizer.from_gguf(os.fspath(smollm2_gguf))
    prompts = bench.make_prompts(lambda t: tok.encode(t, add_special_tokens=True), 27, 64)
    assert len(set(prompts)) == 27
    ids = [tok.encode(p, add_special_tokens=True) for p in prompts]
    assert all(len(i) == 64 for i in ids)
    assert len({i[0] for i in ids}) == 27  # no two share even a first token


def test_ratio_line(bench):
    t = {1: {"tok_s": 30.0}, 4: {"tok_s": 60.0}, 8: {"tok_s": 90.0}}
    p = {1: {"tok_s": 40.0}, 4: {"tok_s": 40.0}, 8: {"tok_s": 45.0}}
    assert bench.ratio_line([1, 4, 8], t, p) == "serve_vs_llamacpp c1=0.75 c4=1.50 c8=2.00"
    assert bench.ratio_line([1, 4, 8], t, {}, "no\nwheel ") == "serve_vs_llamacpp c1=n/a c4=n/a c8=n/a (no wheel)"
    assert bench.ratio_line([1, 4], t, {1: p[1]}, "it died") == "serve_vs_llamacpp c1=0.75 c4=n/a (it died)"


def test_clients_argument(bench):
    assert bench.clients_list("1,4,8") == [1, 4, 8]
    for bad in ("", "0,1", "1,1", "a"):
        with pytest.raises(Exception, match="--clients"):
            bench.clients_list(bad)


def test_llama_server_flags(bench):
    cmd, env = bench.llama_command("/m.gguf", 1234, 2, 512)
    text = " ".join(cmd)
    for flag in ("--n_threads 2", "--n_threads_batch 2", "--interrupt_requests False", "--model /m.gguf",
                 f"--model_alias {bench.MODEL_ID}", "--port 1234", "--host 127.0.0.1"):
        assert flag in text
    cmd, env = bench.tallow_command("/m.gguf", 1234, 2)
    assert env["TALLOW_THREADS"] == "2" and f"{bench.MODEL_ID}=/m.gguf" in cmd and "cpu" in cmd


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_server_that_exits_or_hangs_is_an_error_and_killed(bench, capsys):
    with pytest.raises(RuntimeError, match="exited with 3 before it was ready: bad flag"):
        with bench.serving("dies", [sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"], dict(os.environ),
                           "http://127.0.0.1:9", 60):
            pass
    port = bench.free_port()  # nothing listens there: never ready
    with pytest.raises(RuntimeError, match="not ready after 1 s"):
        with bench.serving("hangs", [sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ),
                           f"http://127.0.0.1:{port}", 1):
            pass
    pid = int(re.search(r"hangs: started pid (\d+)", capsys.readouterr().err).group(1))
    assert _gone(pid)


def test_tallow_side_short_run(smollm2_gguf):
    """The whole bench against a real `tallow serve`, 1 and 2 clients, 8 new tokens, one round."""
    pytest.importorskip("uvicorn", reason="tallow serve needs the serve extra: pip install -e '.[serve]'")
    pytest.importorskip("httpx", reason="the bench's client is httpx: pip install -e '.[dev]'")
    done = subprocess.run([sys.executable, str(BENCH), "--tallow-only", "--gguf", os.fspath(smollm2_gguf),
                           "--clients", "1,2", "--new-tokens", "8", "--rounds", "1", "--ready-timeout", "300",
                           "--request-timeout", "300"], capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "serve_vs_llamacpp c1=n/a c2=n/a (llama.cpp not run: --tallow-only)"
    rows = {}
    for line in lines:
        m = re.fullmatch(r"tallow +(\d+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +(\d+)  usage",
                         line)
        if m:
            rows[int(m.group(1))] = m
    assert sorted(rows) == [1, 2], done.stdout
    for clients, m in rows.items():
        assert (int(m.group(2)), int(m.group(8))) == (8 * clients, 0)  # 8 tokens each, none stopped early
        assert float(m.group(4)) > 0 and float(m.group(5)) <= float(m.group(6))  # tok/s; p50 <= p95
        assert float(m.group(7)) > 0  # the server worked (CPU seconds)
    started = re.search(r"tallow serve: started pid (\d+)", done.stderr)
    assert started and f"tallow serve: stopped pid {started.group(1)}" in done.stderr
    assert "load average" in done.stdout
    assert _gone(int(started.group(1)))


def test_cpu_seconds_matches_os_times(bench):
    sum(i * i for i in range(300_000))  # some CPU work first
    t = os.times()
    assert bench.cpu_seconds(os.getpid()) == pytest.approx(t.user + t.system, abs=0.05)
    assert bench.cpu_seconds(2**22 + 12345) is None  # no such process


PEER_MISSING = """
import sys
sys.path.insert(0, {bench_dir!r})
import llama_cpp_setup
llama_cpp_setup.ensure_llama_cpp = lambda build=True: "no llama-cpp-python wheel here (simulated)"
import serve
sys.exit(serve.main(sys.argv[1:]))
"""


def test_missing_peer_is_said_not_faked(smollm2_gguf):
    """Without llama-cpp-python the bench still prints tallow's figures, then a last line that
    says why the ratios are missing, and exits 1."""
    pytest.importorskip("uvicorn", reason="tallow serve needs the serve extra: pip install -e '.[serve]'")
    pytest.importorskip("httpx", reason="the bench's client is httpx: pip install -e '.[dev]'")
    script = PEER_MISSING.format(bench_dir=str(BENCH.parent))
    done = subprocess.run([sys.executable, "-c", script, "--gguf", os.fspath(smollm2_gguf), "--clients", "1",
                           "--new-tokens", "4", "--rounds", "1", "--ready-timeout", "300", "--request-timeout", "300"],
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "serve_vs_llamacpp c1=n/a (no llama-cpp-python wheel here (simulated))"
    assert any(re.match(r"tallow +1 +4 ", line) for line in lines) and not any("llama-cpp-python " in line
                                                                               for line in lines[:-1])
