#!/usr/bin/env bash
# The main job as a user runs it, checked from outside: `make demo` in the background
# until its URL answers; then the page, the worker and one model file (a Range
# request, as the page resumes downloads); then Ctrl-C, and the server must be gone.
# Then `tallow web build --out DIR` and a plain static server over DIR.
# Used by .ci/run on a fresh clone; exits non-zero, with the demo's log, on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
site=$(mktemp -d)
fail() { echo "check_demo: $*" >&2; echo "---- make demo's output:" >&2; tail -40 "$log" >&2; exit 1; }

# Job control: the demo gets its own process group, and keeps SIGINT (a non-interactive
# shell's background jobs would otherwise start with Ctrl-C ignored).
set -m
make demo PORT=0 >"$log" 2>&1 &
demo=$!
set +m
trap 'kill -KILL -- -$demo 2>/dev/null || true; rm -rf "$site"' EXIT
url=""
for _ in $(seq 1 2700); do  # set-up on a fresh, busy box (apt, pip, models) takes minutes
  url=$(grep -o 'tallow demo: http://127\.0\.0\.1:[0-9]*/' "$log" | head -1 | cut -d' ' -f3 || true)
  [ -n "$url" ] && break
  kill -0 "$demo" 2>/dev/null || fail "make demo ended before it served the demo"
  sleep 1
done
[ -n "$url" ] || fail "no URL after 45 minutes"
grep -q "And so my fellow Americans ask not what your country can do for you" "$log" \
  || fail "the transcription of jfk.wav is not in the output"
echo "check_demo: make demo serves $url"

# Fetched to a file, then searched: `curl | grep -q` fails under pipefail when grep stops reading early.
get() { curl -fsS -o "$site/got" "$1" && grep -qi "$2" "$site/got"; }
get "$url" "<html" || fail "the page did not load"
get "${url}worker.mjs" "pyodide" || fail "the worker did not load"
part=$(curl -fsS "${url}models/manifest.json" | .venv/bin/python -c '
import json, sys
files = [f for m in json.load(sys.stdin)["models"].values() for f in m["files"]]
gguf = next(f for f in files if f["name"].endswith(".gguf"))
print(gguf["parts"][0]["url"] if "parts" in gguf else gguf["url"])')
code=$(curl -sS -o "$site.head" -w '%{http_code}' -r 0-3 "$url$part")
[ "$code" = 206 ] && [ "$(cat "$site.head")" = GGUF ] || fail "Range request for $part: HTTP $code"
rm -f "$site.head"
echo "check_demo: page, worker and a 4-byte range of $part answered"

# Ctrl-C, as in a terminal: SIGINT to the whole process group. A script started with SIGINT
# ignored (a background job of a shell without job control) passes that on to its children,
# where no Ctrl-C can reach: then stop it as a service manager does, with SIGTERM.
stop=INT
(( 0x$(awk '/^SigIgn:/ {print $2}' /proc/$$/status) & 2 )) && stop=TERM
kill -$stop -- -"$demo"
for _ in $(seq 1 30); do kill -0 "$demo" 2>/dev/null || break; sleep 1; done
kill -0 "$demo" 2>/dev/null && fail "make demo still runs 30 s after SIG$stop"
curl -s -o /dev/null "$url" && fail "the server still answers after SIG$stop"
echo "check_demo: SIG$stop stopped it"

.venv/bin/tallow web build --out "$site/site" >/dev/null || fail "tallow web build --out failed"
.venv/bin/python -m http.server 0 --bind 127.0.0.1 -d "$site/site" >"$site/plain.log" 2>&1 &
plain=$!
for _ in $(seq 1 30); do grep -q "port" "$site/plain.log" && break; sleep 1; done
port=$(grep -o 'port [0-9]*' "$site/plain.log" | head -1 | cut -d' ' -f2)
get "http://127.0.0.1:$port/" "<html" || { kill $plain; fail "a plain static server did not serve the built site"; }
curl -fsS "http://127.0.0.1:$port/worker.mjs" >/dev/null || { kill $plain; fail "no worker in the built site"; }
kill $plain
echo "check_demo: tallow web build --out gives a site python -m http.server serves"
