"""Peak memory of a Qwen2.5-0.5B-class Q4_K_M GGUF on the CPU: tallow vs llama.cpp.

Issue #14's target: peak RSS <= 1.3x (file size + KV cache). No real Qwen2.5 GGUF
can be downloaded here, but peak RSS depends on the shapes, the block types and
what a runtime copies, not on the weight values, so the bench writes (once, into
$TALLOW_HOME/synthetic/) a random-weight file of Qwen2.5-0.5B-Instruct's real shape
and llama.cpp's Q4_K_M type mix (scripts/make_synthetic_gguf.py qwen2 q4_k_m).

Each engine runs in a fresh process: load the file, run a prompt of --prompt-tokens,
generate --decode-tokens greedily, report the peak RSS (VmHWM) and, for tallow,
the resident memory (VmRSS) after each phase and the peak's growth in each, which
says where memory goes. The KV cache is the f32 keys and values of every layer for
the whole context (tallow's; llama.cpp keeps f16, half of it).

    python bench/llm_memory.py [--prompt-tokens 128] [--decode-tokens 32] [--threads 2]
    python bench/llm_memory.py --engines tallow,tallow-numpy,llama.cpp   # + the numpy path (no numba)

The last line is `qwen_rss_vs_file_plus_kv=X llamacpp=Y` (llama.cpp's ratio on the
same file; n/a when llama-cpp-python is missing or cannot load it).
"""
import argparse
import json
import os
import sys
import time

from children import compile_tallow, current_rss_bytes, peak_rss_bytes, run_child

HERE = os.path.dirname(os.path.abspath(__file__))
FILE_NAME = "qwen2.5-0.5b-instruct-synthetic-q4_k_m.gguf"
TARGET = 1.3


def synthetic_path():
    home = os.environ.get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")
    return os.path.join(home, "synthetic", FILE_NAME)


def ensure_file(path):
    """The synthetic file, written on first use (about 5 s, 0.4 GB) via a temporary name."""
    if os.path.exists(path):
        return path
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
    import make_synthetic_gguf as maker
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    size = maker.write(partial, "qwen2", "q4_k_m", seed=14)
    os.replace(partial, path)
    print(f"wrote {path} ({size / 1e6:.0f} MB)")
    return path


def kv_cache_bytes(path, context, bytes_per_value=4):
    """Keys + values of every layer for `context` positions, from the file's config."""
    import gguf
    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields[f"qwen2.{key}"]
        return int(f.parts[f.data[0]][0])
    hidden, heads = field("embedding_length"), field("attention.head_count")
    return field("block_count") * 2 * field("attention.head_count_kv") * (hidden // heads) * context * bytes_per_value



def prompt_ids(path, n):
    """n ids from the file's own tokenizer (English text; its merges are random, so mostly bytes).
    tallow's engine loads the tokenizer again with the model, so its peak counts it."""
    import tallow
    tok = tallow.Tokenizer.from_gguf(path)
    text = ("The history of the printing press begins in the fifteenth century, when movable type "
            "changed how books were made, sold and read across Europe and beyond. ")
    ids = tok.encode(text, add_special_tokens=False)
    return (ids * (n // len(ids) + 1))[:n]


def run_tallow(path, ids, decode):
    import tallow
    phases = []

    def mark(name):
        phases.append({"phase": name, "rss_mb": current_rss_bytes() / 1e6, "peak_mb": peak_rss_bytes() / 1e6})
    mark("start")
    model = tallow.load_model(path, device="cpu")
    mark("load")
    token = int(model(ids, last_only=True).reshape(-1).argmax().item())
    mark("prompt")
    for _ in range(decode):
        token = int(model([token], last_only=True).reshape(-1).argmax().item())
    mark("generate")
    return phases


def run_llama_cpp(path, ids, decode, threads):
    import llama_cpp
    llm = llama_cpp.Llama(path, n_ctx=len(ids) + decode + 8, n_threads=threads, n_threads_batch=threads,
                          verbose=False, logits_all=False)
    llm.eval(ids)
    for _ in range(decode):
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    return []


def child(engine, path, ids, n_decode, threads):
    if engine.startswith("tallow"):
        from tallow.settings import tune_process
        tune_process()  # as the CLI does, before numpy loads (OpenBLAS's thread timeout, malloc policy)
    if engine == "tallow-numpy":  # no numba kernels, no f32 cache: numpy dequantises per call (slow)
        os.environ["TALLOW_CPU"] = "numpy"
        os.environ["TALLOW_QUANT_CACHE_MB"] = "0"
    started = time.perf_counter()
    if engine in ("tallow", "tallow-numpy"):
        phases = run_tallow(path, ids, n_decode)
    elif engine == "llama.cpp":
        phases = run_llama_cpp(path, ids, n_decode, threads)
    else:
        raise SystemExit(f"unknown engine {engine!r}: expected tallow, tallow-numpy or llama.cpp")
    print(json.dumps({"engine": engine, "peak_rss_mb": peak_rss_bytes() / 1e6, "phases": phases,
                      "seconds": time.perf_counter() - started}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engines", default="tallow,llama.cpp",
                   help="comma-separated: tallow, llama.cpp, tallow-numpy (numpy path without numba: slow)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gguf", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.prompt_tokens < 1 or args.decode_tokens < 0:
        p.error("--prompt-tokens must be at least 1 and --decode-tokens at least 0")
    if args.child:
        return child(args.child, args.gguf, json.loads(args.ids), args.decode_tokens, args.threads)
    path = ensure_file(synthetic_path())
    file_bytes = os.path.getsize(path)
    ids = prompt_ids(path, args.prompt_tokens)  # here, so no engine's peak includes another's tokenizer
    context = args.prompt_tokens + args.decode_tokens
    kv = kv_cache_bytes(path, context)
    print(f"file {file_bytes / 1e6:.0f} MB, KV cache (f32, {context} positions) {kv / 1e6:.1f} MB, "
          f"target peak RSS <= {TARGET} x {(file_bytes + kv) / 1e6:.0f} = {TARGET * (file_bytes + kv) / 1e6:.0f} MB")
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
               NUMBA_NUM_THREADS=threads)
    compile_tallow()
    ratios = {}
    for engine in args.engines.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", engine, "--gguf", path, "--threads", threads,
               "--ids", json.dumps(ids), "--decode-tokens", str(args.decode_tokens)]
        r, why = run_child(cmd, env)
        if r is None:
            print(f"{engine:<12} skipped: {why}")
            continue
        ratios[engine] = r["peak_rss_mb"] * 1e6 / (file_bytes + kv)
        print(f"{engine:<12} peak RSS {r['peak_rss_mb']:.0f} MB = {ratios[engine]:.2f} x (file + KV), "
              f"{r['seconds']:.1f} s")
        for ph in r["phases"]:
            print(f"  after {ph['phase']:<9} RSS {ph['rss_mb']:6.0f} MB   peak so far {ph['peak_mb']:6.0f} MB")
    t, c = ratios.get("tallow"), ratios.get("llama.cpp")
    print(f"qwen_rss_vs_file_plus_kv={'n/a' if t is None else f'{t:.2f}'} "
          f"llamacpp={'n/a' if c is None else f'{c:.2f}'}")


if __name__ == "__main__":
    main()
