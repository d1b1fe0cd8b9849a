"""The wasm device's threads (issue 31 item 4; tallow.backends.wasm.threads): a call list cut into one
program per thread gives, bit for bit, what the one-thread program gives. Natively the threads'
stretches (the calls between two barriers, thread by thread) run in one thread through kernels.wasm's
`run`, which is what the threads compute; tests/test_browser_wasm_page.py runs them on real threads
(Chromium workers over one shared memory). Also: where barriers stand, what is not shared, the
one-thread module's barrier, and the threaded module's shared memory and stack pointer."""
import numpy as np
import pytest

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
wasmtime = pytest.importorskip("wasmtime", reason="running kernels.wasm natively needs wasmtime (the dev extra)")
from tallow.backends.wasm import build, threads  # noqa: E402
from tallow.backends.wasm.native import Kernels  # noqa: E402
from tallow.backends.wasm.program import StepArg, encode, step_words  # noqa: E402

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)

from random_blocks import random_blocks  # noqa: E402


@pytest.fixture(scope="module")
def wasm():
    return Kernels(build.build())


def _run(wasm, calls, step=None):
    words, count = encode(calls)
    at = wasm.put(np.frombuffer(words.tobytes(), dtype=np.int32))
    step_at = wasm.put(np.frombuffer(step or step_words(0), dtype=np.int32))
    wasm("run", at, count, step_at)


def _threaded_equals_one_thread(wasm, calls, outs, parts, step=None):
    """Run `calls` as one program and as `parts` threads' stretches; every (address, nbytes) of outs
    the same bytes. Returns the per-thread lists."""
    _run(wasm, calls, step)
    want = [wasm.memory.read(wasm.store, at, at + n) for at, n in outs]
    for at, n in outs:
        wasm.memory.write(wasm.store, bytes(n), at)
    lists = threads.plan(calls, parts, wasm.alloc(threads.BARRIER_BYTES), lambda t, nbytes: wasm.alloc(nbytes))
    assert lists is not None and len(lists) == parts
    _run(wasm, threads.segments(lists), step)
    got = [wasm.memory.read(wasm.store, at, at + n) for at, n in outs]
    assert got == want
    return lists


def _quantized_rows(wasm, x):
    m, k = x.shape
    qx, dx, sx = wasm.alloc(m * k * 2), wasm.alloc(m * k // 8), wasm.alloc(m * k // 8)
    for i in range(m):
        wasm("quantize_row", wasm.put(x[i]), k, qx + i * k * 2, dx + i * k // 8, sx + i * k // 8)
    return qx, dx, sx


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("m,n", [(1, 576), (1, 99), (13, 64), (8, 40)])
@pytest.mark.parametrize("parts", [2, 3])
def test_block_products_on_threads_are_bit_identical(wasm, fmt, m, n, parts):
    rng = np.random.default_rng(hash((fmt, m, n, parts)) % 2**32)
    k = 512
    blocks = k // threads.BLOCK_VALUES[fmt]
    raw = wasm.put(random_blocks(fmt, n * blocks, rng))
    qx, dx, sx = _quantized_rows(wasm, rng.standard_normal((m, k)).astype(np.float32))
    out = wasm.alloc(m * n * 4)
    lists = _threaded_equals_one_thread(wasm, [(f"matmul_{fmt}", [raw, n, blocks, m, qx, dx, sx, wasm.table, out])],
                                        [(out, m * n * 4)], parts)
    shares = [next(c for c in calls_t if c[0] != "barrier")[1] for calls_t in lists if len(calls_t) > 1]
    if m == 1:  # weight rows, in pairs
        assert sum(a[1] for a in shares) == n and all(a[1] % 2 == 0 for a in shares[:-1])
    else:  # activation rows, in whole tiles
        assert sum(a[3] for a in shares) == m and all(a[3] % threads.TILE == 0 for a in shares[:-1])


@pytest.mark.parametrize("kernel", ["gemm_f32", "gemm_f16"])
@pytest.mark.parametrize("m,n,k,bias", [(64, 96, 576, True), (7, 50, 700, False), (130, 24, 64, True)])
def test_gemms_on_threads_are_bit_identical(wasm, kernel, m, n, k, bias):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32 if kernel == "gemm_f32" else np.float16)
    bias_at = wasm.put(rng.standard_normal(n).astype(np.float32)) if bias else 0
    out = wasm.alloc(m * n * 4)
    scratch = wasm.alloc(8 * k * 4)
    call = (kernel, [wasm.put(a), k, wasm.put(b), k, bias_at, out, n, m, n, k, scratch])
    lists = _threaded_equals_one_thread(wasm, [call], [(out, m * n * 4)], 3)
    assert all(c[1][-1] != scratch for calls_t in lists[1:] for c in calls_t if c[0] != "barrier")  # own scratch


def test_quantised_gemm_on_threads_is_bit_identical(wasm):
    rng = np.random.default_rng(5)
    m, n, k = 20, 72, 512
    raw = wasm.put(random_blocks("q4_k", n * k // 256, rng))
    out = wasm.alloc(m * n * 4)
    call = ("gemm_q", [5, wasm.put(rng.standard_normal((m, k)).astype(np.float32)), k, raw, k // 256, 0, out, n, m, n,
                       wasm.table, wasm.alloc(16 * k * 4)])
    _threaded_equals_one_thread(wasm, [call], [(out, m * n * 4)], 2)


def test_a_decode_like_program_on_threads_is_bit_identical(wasm):
    """Serial calls (quantize_row, a norm, a StepArg copy) between shared products and row kernels:
    thread 0 alone runs them, with barriers on both sides of every shared call."""
    rng = np.random.default_rng(9)
    k, n = 576, 960
    x = wasm.put(rng.standard_normal(k).astype(np.float32))
    w = wasm.put(rng.standard_normal(k).astype(np.float32))
    total, normed = wasm.alloc(k * 4), wasm.alloc(k * 4)
    qx, dx, sx = wasm.alloc(k * 2), wasm.alloc(k // 8), wasm.alloc(k // 8)
    raw = wasm.put(random_blocks("q4_1", n * k // 32, rng))
    h = wasm.alloc(n * 4)
    cache = wasm.alloc(8 * n * 4)
    rows = wasm.alloc(40 * n * 4)
    probs = wasm.alloc(40 * 128 * 4)
    calls = [("add_rms_norm", [x, x, w, k, 1e-5, total, normed]),
             ("quantize_row", [normed, k, qx, dx, sx]),
             ("matmul_q4_1", [raw, n, k // 32, 1, qx, dx, sx, wasm.table, h]),
             ("copy_f32", [h, n, StepArg(cache, n * 4)]),
             ("layer_norm_rows", [cache, 40, 24 * 8, 0, 0, 1e-5, rows]),  # (reads past the cache: only bits)
             ("softmax_rows", [cache, 40, 128, 128, 0.5, 3, probs])]
    lists = _threaded_equals_one_thread(wasm, calls, [(h, n * 4), (cache, 8 * n * 4), (rows, 40 * 192 * 4),
                                                      (probs, 40 * 128 * 4)], 2, step_words(5))
    names = [[c[0] for c in calls_t] for calls_t in lists]
    assert names[0] == ["add_rms_norm", "quantize_row", "barrier", "matmul_q4_1", "barrier", "copy_f32", "barrier",
                        "layer_norm_rows", "barrier", "softmax_rows", "barrier"]
    assert names[1] == ["barrier", "matmul_q4_1", "barrier", "barrier", "layer_norm_rows", "barrier", "softmax_rows",
                        "barrier"]


def test_small_or_moving_calls_stay_on_thread_zero():
    table = 1000
    assert threads.split("matmul_q4_0", [0, 8, 18, 1, 0, 0, 0, table, 0], 2, None) is None  # 8 rows
    assert threads.split("matmul_q4_0", [0, 4096, 18, StepArg(1, 1), 0, 0, 0, table, 0], 2, None) is None
    assert threads.split("softmax_rows", [0, StepArg(0, 1), 64, 64, 1.0, 0, 0], 2, None) is None
    assert threads.split("add_rms_norm", [0, 0, 0, 4096, 1e-5, 0, 0], 2, None) is None
    assert threads.plan([("add_f32", [0, 0, 64, 0])], 2, 0, None) is None  # nothing shared: the one program


def test_one_thread_module_barrier_returns_alone_and_traps_for_more(wasm):
    words = wasm.alloc(threads.BARRIER_BYTES)
    wasm("barrier", words, 1)
    with pytest.raises(wasmtime.Trap):
        wasm("barrier", words, 2)


def test_threaded_module_shares_its_memory_and_exports_the_stack_pointer():
    module = wasmtime.Module.from_file(wasmtime.Engine(), build.build(threaded=True))
    (memory,) = module.imports
    assert memory.type.is_shared and memory.type.limits.max == 65536  # 4 GiB of 64 KiB pages
    one = {e.name for e in wasmtime.Module.from_file(wasmtime.Engine(), build.build()).exports}
    assert {e.name for e in module.exports} == one | {"__stack_pointer"}
