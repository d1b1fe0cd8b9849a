"""GGUF decoders (SmolLM2-135M-Instruct Q4_1 by default): prefill and decode speed, peak memory and time
from process start to the first token: tallow (numba kernels on the GGUF blocks when
numba is installed; "tallow-no-kernels" is the numpy path with f32 copies) vs
transformers + PyTorch (same GGUF, dequantised to f32) vs llama.cpp
(llama-cpp-python, when installed), plus the memory-bandwidth floor. The last line
is `decode_vs_llamacpp=X prefill_vs_llamacpp=Y rss_vs_llamacpp=Z` (n/a without llama.cpp).

    python bench/llm.py [--gguf PATH ...] [--prompt-tokens 64] [--decode-tokens 32] [--threads 2] [--repeat 3]
    python bench/llm.py --gguf synthetic:gemma3-270m --gguf synthetic:qwen2 --engines tallow,llama.cpp

--gguf may be given several times: each file gets its table and one summary line (its
general.name, architecture and quant mix by bytes), and the last line is the first file's.
`synthetic:<arch>` is scripts/make_synthetic_gguf.py's full-size Q4_K_M file of that shape
(made once into $TALLOW_HOME/synthetic; random weights: speed and memory as the real file's).

Each engine runs in its own process (so peak RSS is its own) with 2 threads (--threads),
--repeat times in rounds; each figure is its best. tallow's peak RSS is also split by stage.
Decoding is memory-bound: the floor per token is the weight bytes read per
token divided by the measured bandwidth of a large numpy copy.
"""
import argparse
import json
import os
import sys
import time

from children import compile_tallow, peak_rss_bytes, run_child

THREADS = os.environ.get("TALLOW_BENCH_THREADS", "2")  # --threads sets it for the child processes
ENGINES = ("tallow", "tallow-no-kernels", "transformers", "llama.cpp")
STARTED = time.time()  # the child's own process start, for the time to its first token


def resolve_gguf(name):
    """A path; `synthetic:<arch>[:<quant>]` is make_synthetic_gguf's cached file (written on first use)."""
    if not name.startswith("synthetic:"):
        return name
    _, arch, *quant = name.split(":")
    scripts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
    sys.path.insert(0, scripts)
    try:
        import make_synthetic_gguf
    finally:
        sys.path.remove(scripts)
    return make_synthetic_gguf.cached(arch, *(quant or ["q4_k_m"]), log=lambda m: print(m, file=sys.stderr))


def describe(gguf):
    """'<general.name> (<architecture>, <block types by share of the weight bytes>)'."""
    import tallow
    f = tallow.io.open(gguf)
    sizes = {}
    for name in f.keys():
        info = f.info(name)
        if len(info.shape) >= 2:  # matrices: the norms and biases are f32 everywhere
            kind = info.dtype.name.upper()
            sizes[kind] = sizes.get(kind, 0) + info.nbytes
    total = sum(sizes.values()) or 1
    mix = " ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]))
    name = f.metadata.get("general.name") or os.path.basename(gguf)
    return f"{name} ({f.metadata.get('general.architecture', '?')}, {mix})"


def find_gguf():
    env = os.environ.get("TALLOW_SMOLLM2_GGUF")
    if env:
        return env
    import tallow
    return os.fspath(tallow.hub.fetch("smollm2-135m-instruct", progress=False))


def peak_rss_mb():
    return peak_rss_bytes() / 2**20


def prompt_ids(gguf, n):
    """n token ids of ordinary English text, from the model's own tokenizer."""
    import tallow
    tok = tallow.Tokenizer.from_gguf(gguf)
    text = ("The history of the printing press begins in the fifteenth century, when movable type "
            "changed how books were made, sold and read across Europe and beyond. ") * 20
    return tok.encode(text, add_special_tokens=False)[:n]


def mark_first_token():
    """Wall time from the start, and the process's CPU time: on a box that other jobs share,
    the wall time to the first token mostly measures them; the CPU time is the work done."""
    FIRST_TOKEN.append(time.time() - STARTED)
    cpu = os.times()
    FIRST_TOKEN_CPU.append(cpu.user + cpu.system)


def run_tallow(gguf, ids, decode):
    import tallow
    from tallow.backends.cpu.runtime import kernel_calls
    RSS_STAGES.append(("python+numpy+tallow", peak_rss_mb()))
    if kernel_calls.kernels() is not None:  # llvmlite and the kernels' cached machine code (or numba's)
        RSS_STAGES.append(("kernels", peak_rss_mb()))
    t0 = time.perf_counter()
    model = tallow.load_model(gguf, device="cpu")
    load = time.perf_counter() - t0
    RSS_STAGES.append(("load_model", peak_rss_mb()))
    int(model(ids, last_only=True).reshape(-1).argmax().item())  # cold: the first token of a fresh process
    mark_first_token()
    RSS_STAGES.append(("first prompt (mapped weights read, KV cache, kernels loaded)", peak_rss_mb()))
    model.reset()
    # warm-up: first use fills per-weight caches (numpy backend's f32 copies) and loads the
    # decode kernels and the replayed step's program from numba's cache (once per process)
    token = int(model(ids[:8], last_only=True).reshape(-1).argmax().item())
    for _ in range(4):
        token = int(model([token], last_only=True).reshape(-1).argmax().item())
    model.reset()
    t0 = time.perf_counter()
    logits = model(ids, last_only=True)
    prefill = time.perf_counter() - t0
    token = int(logits.reshape(-1).argmax().item())
    t0 = time.perf_counter()
    for _ in range(decode):
        token = int(model([token], last_only=True).reshape(-1).argmax().item())
    dec = time.perf_counter() - t0
    return load, prefill, dec


def run_transformers(gguf, ids, decode):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                              dtype=torch.float32).eval()
    load = time.perf_counter() - t0
    with torch.inference_mode():
        model(torch.tensor([ids[:8]]))
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        prefill = time.perf_counter() - t0
        cache = getattr(out, "cache", None) or out.past_key_values
        token = int(out.logits[0, -1].argmax())
        t0 = time.perf_counter()
        for _ in range(decode):
            out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            token = int(out.logits[0, -1].argmax())
        dec = time.perf_counter() - t0
    return load, prefill, dec


def run_llama_cpp(gguf, ids, decode):
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(gguf, n_ctx=512, n_threads=int(THREADS), n_threads_batch=int(THREADS), verbose=False,
                          logits_all=False)
    load = time.perf_counter() - t0
    llm.eval(ids)  # cold: the first token of a fresh process
    int(llm.scores[llm.n_tokens - 1].argmax())
    mark_first_token()
    llm.reset()
    llm.eval(ids[:8])  # the same warm-up as tallow's: a short prompt and 4 decoded tokens
    for _ in range(4):
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode):
        token = int(llm.scores[llm.n_tokens - 1].argmax())  # eval() keeps the last position's logits there
        llm.eval([token])
    dec = time.perf_counter() - t0
    return load, prefill, dec


FIRST_TOKEN = []
FIRST_TOKEN_CPU = []  # CPU seconds (user + system, all threads) the process spent until then
RSS_STAGES = []  # (stage, peak RSS MB so far): where tallow's memory goes


def child(engine, gguf, ids, n_decode):
    if engine.startswith("tallow"):
        from tallow.settings import tune_process
        tune_process()  # as the CLI does, before numpy loads (OpenBLAS's thread timeout, malloc policy)
    if engine == "tallow":
        load, prefill, dec = run_tallow(gguf, ids, n_decode)
    elif engine == "tallow-no-kernels":
        os.environ["TALLOW_CPU"] = "numpy"  # the numpy path: f32 copies of the weights (as without numba)
        load, prefill, dec = run_tallow(gguf, ids, n_decode)
    elif engine == "tallow-no-f32-cache":
        os.environ["TALLOW_CPU"] = "numpy"
        os.environ["TALLOW_QUANT_CACHE_MB"] = "0"  # numpy, dequantising per call: weights stay quantised
        load, prefill, dec = run_tallow(gguf, ids, n_decode)
    elif engine == "transformers":
        load, prefill, dec = run_transformers(gguf, ids, n_decode)
    else:
        load, prefill, dec = run_llama_cpp(gguf, ids, n_decode)
    print(json.dumps({"engine": engine, "load_s": load, "prefill_tok_s": len(ids) / prefill,
                      "decode_tok_s": n_decode / dec, "peak_rss_mb": peak_rss_mb(), "prompt_tokens": len(ids),
                      "first_token_s": FIRST_TOKEN[0] if FIRST_TOKEN else None,
                      "first_token_cpu_s": FIRST_TOKEN_CPU[0] if FIRST_TOKEN_CPU else None, "rss_stages": RSS_STAGES}))


def bandwidth_gb_s():
    """Read+write bandwidth of a 256 MB numpy copy (best of 5)."""
    import numpy as np
    a = np.ones(64 * 2**20, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def weight_bytes(gguf):
    """(bytes of the GGUF's weights, bytes as f32) read per decoded token. The tied
    embedding table is read whole as the output layer; its row lookup is negligible."""
    import tallow
    f = tallow.io.open(gguf)
    quant = f32 = 0
    for name in f.keys():
        info = f.info(name)
        n = 1
        for s in info.shape:
            n *= s
        quant += info.nbytes
        f32 += 4 * n
    return quant, f32


def _best(runs):
    """One engine's best figures over repeated runs (each figure's own best: fastest, smallest)."""
    best = dict(runs[0])
    for key in ("prefill_tok_s", "decode_tok_s"):
        best[key] = max(r[key] for r in runs)
    for key in ("load_s", "peak_rss_mb", "first_token_s", "first_token_cpu_s"):
        if best.get(key) is not None:
            best[key] = min(r[key] for r in runs)
    best["runs"] = len(runs)
    return best


def ratios(results):
    """(tallow / llama.cpp figures as the last line gives them, or None without both)."""
    base = {r["engine"]: r for r in results}
    if "tallow" not in base or "llama.cpp" not in base:
        return None
    t, c = base["tallow"], base["llama.cpp"]
    return (f"decode_vs_llamacpp={t['decode_tok_s'] / c['decode_tok_s']:.2f} "
            f"prefill_vs_llamacpp={t['prefill_tok_s'] / c['prefill_tok_s']:.2f} "
            f"rss_vs_llamacpp={t['peak_rss_mb'] / c['peak_rss_mb']:.2f}"), t["load_s"] / c["load_s"]


def bench_file(gguf, args, env, bw):
    """Run the engines on one file and print its table; returns its results."""
    ids = prompt_ids(gguf, args.prompt_tokens)
    runs = {}
    for _ in range(args.repeat):  # rounds over all engines, so a busy spell hits them alike
        for engine in args.engines.split(","):
            cmd = [sys.executable, __file__, "--child", engine, "--gguf", gguf, "--ids", ",".join(map(str, ids)),
                   "--decode-tokens", str(args.decode_tokens)]
            result, why = run_child(cmd, env)
            if result is None:
                print(f"{engine:<22} skipped: {why}")
                continue
            runs.setdefault(engine, []).append(result)
    results = [_best(rs) for rs in runs.values()]
    quant, f32 = weight_bytes(gguf)
    print(f"\n{describe(gguf)}, {len(ids)}-token prompt, {args.decode_tokens} greedy decode steps, "
          f"{THREADS} threads, best of {args.repeat}")
    print(f"{'engine':<22} {'load s':>7} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12} "
          f"{'1st token s':>12} {'(CPU s)':>8}")
    for r in results:
        first = f"{r['first_token_s']:>12.2f}" if r.get("first_token_s") else f"{'':>12}"
        first += f" {r['first_token_cpu_s']:>8.2f}" if r.get("first_token_cpu_s") else ""
        print(f"{r['engine']:<22} {r['load_s']:>7.2f} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f} "
              f"{r['peak_rss_mb']:>12.0f} {first}")
    for r in results:
        if r.get("rss_stages"):
            steps, before = [], 0.0
            for stage, mb in r["rss_stages"] + [["decoding", r["peak_rss_mb"]]]:
                steps.append(f"{stage} +{mb - before:.0f}")
                before = mb
            print(f"{r['engine']} peak RSS by stage (MB): " + ", ".join(steps))
    print(f"weights read per token: {quant / 1e6:.0f} MB as stored -> floor {bw * 1e9 / quant:.0f} tok/s; "
          f"{f32 / 1e6:.0f} MB as f32 -> floor {bw * 1e9 / f32:.0f} tok/s")
    base = {r["engine"]: r for r in results}
    if "tallow" in base and "transformers" in base:
        t, h = base["tallow"], base["transformers"]
        print(f"tallow / transformers: decode {t['decode_tok_s'] / h['decode_tok_s']:.2f}x, "
              f"prefill {t['prefill_tok_s'] / h['prefill_tok_s']:.2f}x")
    if "tallow" in base and "llama.cpp" in base:
        t, c = base["tallow"], base["llama.cpp"]
        print(f"time to first token: tallow {t['first_token_s']:.2f} s, llama.cpp {c['first_token_s']:.2f} s "
              f"({t['first_token_s'] / c['first_token_s']:.2f}x); CPU time to it: "
              f"tallow {t['first_token_cpu_s']:.2f} s, llama.cpp {c['first_token_cpu_s']:.2f} s "
              f"({t['first_token_cpu_s'] / c['first_token_cpu_s']:.2f}x)")
    return results


def main(argv=None):
    global THREADS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", action="append", default=None,
                   help="a GGUF file or synthetic:<arch> (several: one table and summary line each)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--threads", default=THREADS, help="tallow/BLAS/torch/llama.cpp threads (default 2)")
    p.add_argument("--repeat", type=int, default=1, help="runs per engine; each figure is the best of them")
    p.add_argument("--no-build", action="store_true", help="do not build llama-cpp-python when it is missing")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ids", default=None, help=argparse.SUPPRESS)  # the child's prompt
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    THREADS = os.environ["TALLOW_BENCH_THREADS"] = str(args.threads)
    if args.child:
        return child(args.child, args.gguf[0], [int(i) for i in args.ids.split(",")], args.decode_tokens)
    ggufs = [resolve_gguf(g) for g in args.gguf] if args.gguf else [find_gguf()]
    # the prompt's ids are made here and handed to each engine's process, so none of them pays
    # (in time or memory) for a tokenizer the others do not load
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS,
               TALLOW_THREADS=THREADS)
    no_llama = None
    if "llama.cpp" in args.engines.split(","):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from llama_cpp_setup import ensure_llama_cpp
        no_llama = ensure_llama_cpp(build=not args.no_build)
    compile_tallow()
    bw = bandwidth_gb_s()
    print(f"memory bandwidth (numpy copy, read+write): {bw:.1f} GB/s")
    summaries = []
    for gguf in ggufs:
        found = ratios(bench_file(gguf, args, env, bw))
        summaries.append((describe(gguf), found))
    print()
    for name, found in summaries:  # one summary per file
        figures = f"{found[0]} load_vs_llamacpp={found[1]:.2f}" if found else "n/a"
        print(f"{name}: {figures}")
    first = summaries[0][1]
    if first:
        print(first[0])
    else:  # the line the issue asks for, saying plainly what could not be compared
        why = no_llama or "llama.cpp did not run"
        print(f"decode_vs_llamacpp=n/a prefill_vs_llamacpp=n/a rss_vs_llamacpp=n/a ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
