"""`tallow serve` vs llama-cpp-python's OpenAI server (`python -m llama_cpp.server`): aggregate
decode tokens/s and time to first token for 1, 4 and 8 concurrent streaming clients, SmolLM2-135M-
Instruct Q4_1 (the same GGUF file for both), 64-token prompts, 64 new tokens, greedy, 2 threads.
The last line is `serve_vs_llamacpp c1=X c4=Y c8=Z`: tallow's aggregate decode tok/s over llama.cpp's.

    python bench/serve.py [--clients 1,4,8] [--rounds 2] [--prompt-tokens 64] [--new-tokens 64]
                          [--threads 2] [--gguf PATH] [--tallow-only] [--no-build]

How it measures:
* The two servers never run together (they would share the box's cores): they take turns round
  by round (--rounds), so a busy spell on a shared box hits both alike. In each round each server
  starts afresh (a child process in its own process group), warms up, serves each concurrency
  once, and is killed (always, also on an error).
* A client is an asyncio task with its own HTTP connection (httpx) that sends one streaming
  `POST /v1/completions` (`temperature` 0, `max_tokens` --new-tokens) and reads the server-sent
  events. The same client code talks to both servers. `c` clients start together.
* Every request has its own prompt (a different window of the same English passage, exactly
  --prompt-tokens tokens by tallow's tokenizer, which matches the model's; llama-cpp-python
  reuses the KV cache of a shared prefix, so no two requests share one). Before timing, each
  server answers the round's prompts and a warm-up prompt with one token each (checking that its
  `usage.prompt_tokens` is --prompt-tokens; this warms prefill up), then streams the warm-up
  prompt in full.
* Generated tokens per request: the stream's `usage` when the server sends it (tallow does, with
  `stream_options.include_usage`; llama-cpp-python does not), else --new-tokens when
  `finish_reason` is `length`, else the streamed text re-tokenized (a request that stopped at
  end-of-text early; the table counts those under "early").
* Aggregate decode tok/s = all generated tokens of a round / wall time from the first request
  sent to the last stream finished (prefill and queueing included: what the box delivers to c
  clients). Time to first token (TTFT) = from sending a request to its first event carrying text;
  p50/p95 over the round's requests (linear interpolation, as numpy's percentile).
* Each concurrency's row is its round with the highest tok/s. "CPU s" is the server process's
  user + system CPU time (all threads; spin-waiting ones too) while that concurrency ran.
* llama-cpp-python's server runs with `--n_threads/--n_threads_batch` = --threads,
  `--interrupt_requests False` (its default True ends a stream early whenever another request
  waits) and `--logits_all False` (no logits for prompt positions: nothing here needs them).
  tallow's gets TALLOW_THREADS = --threads.
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

MODEL_ID = "smollm2-135m-instruct"
PASSAGE = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how books "
    "were made, sold and read across Europe. Before it, a scribe could spend months copying a single volume "
    "by hand, and a library of a few hundred books was counted as a treasure. Johannes Gutenberg, a goldsmith "
    "from Mainz, combined a screw press borrowed from wine makers with metal letters cast in a hand mould and "
    "an ink that clung to metal rather than wood. His workshop printed a Bible of about thirteen hundred pages "
    "in two columns, and within fifty years presses were running in more than two hundred cities. Printers "
    "travelled along the trade routes of the Rhine and the Alps, carrying their type cases with them, and "
    "merchants in Venice, Lyon and Antwerp soon turned the new craft into a busy trade. Prices fell, pamphlets "
    "spread news and arguments faster than any rider, and scholars could compare identical copies of a text "
    "in distant towns. Spelling slowly settled, maps and tables of numbers were reproduced without the errors "
    "of copying, and the idea of an author who owned the words on a page began to take shape. Governments "
    "and churches tried to license printers and to ban books they disliked, yet forbidden titles were printed "
    "abroad and smuggled home in barrels and bales of cloth. By the time of the first newspapers, a reader in "
    "a small market town could learn within weeks what had happened in a capital far away, and the habits of "
    "reading silently, alone and often, had spread from monasteries and universities to shops and kitchens. "
)


# ---- statistics and stream parsing (unit-tested in tests/test_bench_serve.py) ----

def percentile(values, q):
    """The q-th percentile (0-100) with linear interpolation between order statistics, as
    numpy.percentile's default; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(s) - 1)
    return s[low] + (s[high] - s[low]) * (pos - low)


class SSE:
    """Server-sent events from lines (without their line ends): feed() returns an event's data
    (its `data:` lines joined by newlines) when the blank line that ends it arrives, else None.
    Comment lines (`: ping`, sent by sse-starlette) and other fields are skipped."""

    def __init__(self):
        self.data = []

    def feed(self, line):
        if line == "":
            if not self.data:
                return None
            data, self.data = "\n".join(self.data), []
            return data
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)
        return None


class Stream:
    """One streamed completion as the client saw it."""

    def __init__(self, sent):
        self.sent = sent  # perf_counter() when the request was sent
        self.first = None  # ... when the first event carrying text arrived
        self.done = None  # ... when the stream ended
        self.text = []
        self.finish_reason = None
        self.usage = None

    def event(self, data, now):
        """Take one event's data; True at the end of the stream (`[DONE]`)."""
        if data == "[DONE]":
            return True
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"the server sent an error in the stream: {chunk['error']}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            text = choice.get("text")
            if text is None:  # a chat chunk
                text = (choice.get("delta") or {}).get("content")
            if text:
                self.text.append(text)
                if self.first is None:
                    self.first = now
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return False

    def tokens(self, max_tokens, count_tokens):
        """(generated tokens, how they were counted): the stream's usage, else max_tokens for a
        stream that stopped at the length limit, else the text re-tokenized (it stopped early)."""
        if self.usage and self.usage.get("completion_tokens") is not None:
            return int(self.usage["completion_tokens"]), "usage"
        if self.finish_reason == "length":
            return max_tokens, "length"
        return count_tokens("".join(self.text)), "text"


def round_figures(streams, max_tokens, count_tokens):
    """A round's row: aggregate tok/s over the wall time from the first request sent to the last
    stream finished, TTFT percentiles (seconds), the token count and how it was counted."""
    counted = [s.tokens(max_tokens, count_tokens) for s in streams]
    tokens = sum(n for n, _ in counted)
    wall = max(s.done for s in streams) - min(s.sent for s in streams)
    ttft = [s.first - s.sent for s in streams if s.first is not None]
    return {"clients": len(streams), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95),
            "early": sum(1 for s in streams if s.finish_reason != "length"),
            "counted_by": sorted({how for _, how in counted})}


def make_prompts(encode, n, prompt_tokens, step=5):
    """n different prompts of exactly prompt_tokens tokens (by encode): word windows of PASSAGE
    starting step words apart (cycling), each grown word by word until it has the length; a
    window that cannot hit it exactly (the next word overshoots), or starts with a word another
    prompt starts with, moves on by one word."""
    words = PASSAGE.split()
    prompts, start, firsts = [], 0, set()
    while len(prompts) < n:
        if start >= 10 * len(words):
            raise RuntimeError(f"cannot cut {n} prompts of exactly {prompt_tokens} tokens with different first words "
                               "from the passage: ask for fewer rounds or clients")
        text, count, i = "", 0, start
        while count < prompt_tokens:
            text = (text + " " + words[i % len(words)]).strip()
            count = len(encode(text))
            i += 1
        if count == prompt_tokens and text.split()[0] not in firsts:
            firsts.add(text.split()[0])
            prompts.append(text)
            start += step
        else:
            start += 1
    return prompts


def ratio_line(clients, tallow_rows, peer_rows, why_not=None):
    """The last line: tallow's aggregate tok/s over llama.cpp's at each concurrency, or n/a with
    the reason the peer is missing."""
    parts = []
    for c in clients:
        t, p = tallow_rows.get(c), peer_rows.get(c)
        parts.append(f"c{c}={t['tok_s'] / p['tok_s']:.2f}" if t and p else f"c{c}=n/a")
    line = "serve_vs_llamacpp " + " ".join(parts)
    return line + (f" ({' '.join(why_not.split())})" if why_not else "")  # one line, whatever pip said


# ---- the servers ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path, lines=5):
    with open(path, errors="replace") as f:
        return " | ".join(f.read().strip().splitlines()[-lines:]) or "no output"


@contextmanager
def serving(name, cmd, env, base, ready_timeout):
    """Start cmd in its own process group (its output to a temporary log), wait until GET
    base/v1/models answers 200 (a hang guard: at most ready_timeout seconds, or until it exits),
    yield it, and always kill the whole group at the end."""
    import httpx
    prefix = "bench-serve-" + name.replace(" ", "-") + "-"
    log = tempfile.NamedTemporaryFile("w+b", prefix=prefix, suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    print(f"{name}: started pid {proc.pid} (log {log.name})", file=sys.stderr, flush=True)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} before it was ready: {_log_tail(log.name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready after {ready_timeout:.0f} s: {_log_tail(log.name)}")
            try:
                if httpx.get(base + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        print(f"{name}: stopped pid {proc.pid}", file=sys.stderr, flush=True)


def tallow_command(gguf, port, threads):
    env = dict(os.environ, TALLOW_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return [sys.executable, "-m", "tallow", "serve", "--model", f"{MODEL_ID}={gguf}", "--device", "cpu",
            "--port", str(port), "--no-access-log"], env


def llama_command(gguf, port, threads, n_ctx):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", MODEL_ID,
            "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx), "--interrupt_requests", "False",
            "--logits_all", "False", "--verbose", "False"], env


# ---- the client ----

def _body(prompt, max_tokens, stream):
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_one(client, base, prompt, max_tokens):
    """Send one streaming completion and read it to the end: a Stream with its timings."""
    result = Stream(time.perf_counter())
    parser = SSE()
    async with client.stream("POST", base + "/v1/completions", json=_body(prompt, max_tokens, True)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: status {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            data = parser.feed(line)
            if data is not None and result.event(data, time.perf_counter()):
                break
    result.done = time.perf_counter()
    return result


async def one_round(base, prompts, max_tokens, timeout):
    """len(prompts) clients at once, one request each; their Streams."""
    import httpx
    clients = [httpx.AsyncClient(timeout=timeout) for _ in prompts]
    try:
        return await asyncio.gather(*(stream_one(c, base, p, max_tokens) for c, p in zip(clients, prompts)))
    finally:
        for c in clients:
            await c.aclose()


def check_prompts(base, prompts, prompt_tokens, timeout):
    """Each prompt once, non-streamed, one new token: the server's own prompt token count."""
    import httpx
    with httpx.Client(timeout=timeout) as client:
        for p in prompts:
            r = client.post(base + "/v1/completions", json=_body(p, 1, False))
            r.raise_for_status()
            n = r.json()["usage"]["prompt_tokens"]
            if n != prompt_tokens:
                raise RuntimeError(f"{base} counts {n} prompt tokens, not {prompt_tokens}, in {p[:40]!r}...")


def cpu_seconds(pid):
    """User + system CPU seconds of process pid (all its threads) so far, from /proc; None
    where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_round(name, cmd_env, warm, plan, args, count_tokens):
    """Start a server; check the token count of the prompt warm and of the round's prompts (one
    new token each: this warms its prefill up too) and stream warm in full; run each concurrency
    of plan ({clients: its prompts}) once; stop it: {clients: row}."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd, env = cmd_env(port)
    rows = {}
    with serving(name, cmd, env, base, args.ready_timeout) as proc:
        check_prompts(base, [warm] + [p for timed in plan.values() for p in timed], args.prompt_tokens,
                      args.request_timeout)
        asyncio.run(one_round(base, [warm], args.new_tokens, args.request_timeout))
        for c, timed in plan.items():
            cpu = cpu_seconds(proc.pid)
            streams = asyncio.run(one_round(base, timed, args.new_tokens, args.request_timeout))
            row = round_figures(streams, args.new_tokens, count_tokens)
            after = cpu_seconds(proc.pid)
            row["cpu_s"] = None if cpu is None or after is None else after - cpu
            print(f"  {name} c{c}: {row['tok_s']:.1f} tok/s, ttft p50 {row['ttft_p50']:.2f} s",
                  file=sys.stderr, flush=True)
            rows[c] = row
    return rows


# ---- main ----

def find_gguf():
    env = os.environ.get("TALLOW_SMOLLM2_GGUF")
    if env:
        return env
    import tallow
    return os.fspath(tallow.hub.fetch(MODEL_ID, progress=False))


def clients_list(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--clients wants distinct positive counts like 1,4,8, got {text!r}")
    return values


def print_table(rows_by_side, args, loads):
    print(f"\nSmolLM2-135M-Instruct Q4_1, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, "
          f"greedy, streamed /v1/completions, {args.threads} threads, best of {args.rounds} rounds; "
          f"{os.cpu_count()} cores, load average {loads[0][0]:.1f} before, {loads[1][0]:.1f} after")
    print(f"{'server':<16} {'clients':>7} {'tokens':>7} {'wall s':>7} {'tok/s':>8} {'TTFT p50 s':>11} "
          f"{'TTFT p95 s':>11} {'CPU s':>6} {'early':>6}  counted by")
    for side, rows in rows_by_side.items():
        for c in args.clients:
            if c in rows:
                r = rows[c]
                cpu = "n/a" if r.get("cpu_s") is None else f"{r['cpu_s']:.1f}"
                print(f"{side:<16} {c:>7} {r['tokens']:>7} {r['wall_s']:>7.2f} {r['tok_s']:>8.1f} "
                      f"{r['ttft_p50']:>11.3f} {r['ttft_p95']:>11.3f} {cpu:>6} {r['early']:>6}  "
                      f"{','.join(r['counted_by'])}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=None, help="the GGUF both servers load (default: tallow's SmolLM2 Q4_1)")
    p.add_argument("--clients", type=clients_list, default=[1, 4, 8], help="concurrencies (default 1,4,8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per server; each row is the best (default 2)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    p.add_argument("--tallow-only", action="store_true", help="do not run llama-cpp-python's server")
    p.add_argument("--no-build", action="store_true", help="do not build llama-cpp-python when it is missing")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds a server may take to start (hang guard; default 600)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (hang guard)")
    args = p.parse_args(argv)
    for name in ("rounds", "prompt_tokens", "new_tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    import tallow
    gguf = os.path.abspath(args.gguf or find_gguf())
    tok = tallow.Tokenizer.from_gguf(gguf)
    # tallow's server encodes a prompt with add_special_tokens=True; generated text without
    try:
        prompts = make_prompts(lambda t: tok.encode(t, add_special_tokens=True),
                               1 + args.rounds * sum(args.clients), args.prompt_tokens)
    except RuntimeError as e:
        p.error(str(e))

    def count_tokens(text):
        return len(tok.encode(text, add_special_tokens=False))

    n_ctx = max(512, args.prompt_tokens + args.new_tokens + 16)
    sides = {"tallow": ("tallow serve", lambda port: tallow_command(gguf, port, args.threads))}
    why_not = None
    if args.tallow_only:
        why_not = "llama.cpp not run: --tallow-only"
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from llama_cpp_setup import ensure_llama_cpp, ensure_llama_cpp_server
        why_not = ensure_llama_cpp(build=not args.no_build) or ensure_llama_cpp_server()
        if why_not is None:
            sides["llama-cpp-python"] = ("llama_cpp.server",
                                         lambda port: llama_command(gguf, port, args.threads, n_ctx))
    import httpx
    load = os.getloadavg()
    best = {side: {} for side in sides}
    for r in range(args.rounds):  # the servers take turns round by round, so a busy spell hits both alike
        offsets = [sum(args.clients[:i]) for i in range(len(args.clients))]
        plan = {c: prompts[1 + r * sum(args.clients) + o:][:c] for c, o in zip(args.clients, offsets)}
        for side, (name, cmd_env) in list(sides.items()):
            try:
                rows = server_round(name, cmd_env, prompts[0], plan, args, count_tokens)
            except (RuntimeError, OSError, httpx.HTTPError) as e:
                if side == "tallow":
                    raise
                why_not = f"llama_cpp.server failed: {e}"  # the peer failing is reported, not raised
                del sides[side]
                best[side] = {}
                continue
            for c, row in rows.items():
                if c not in best[side] or row["tok_s"] > best[side][c]["tok_s"]:
                    best[side][c] = row
    load_after = os.getloadavg()
    print_table(best, args, (load, load_after))
    print(ratio_line(args.clients, best["tallow"], best.get("llama-cpp-python", {}), why_not))
    return 0 if args.tallow_only or why_not is None else 1

if __name__ == "__main__":
    sys.exit(main())
