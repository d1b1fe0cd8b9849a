"""The wasm device's native driver (tallow.backends.wasm.driver_native.WasmtimeDriver): buffers in
kernels.wasm's memory, launches of its exports, and a recorded step replayed as one `run` call
with the step words rewritten, against the same launches made eagerly (bit for bit) and numpy."""
import numpy as np
import pytest

from tallow.dtypes import f32
from tallow.errors import DeviceError, ShapeError, UnsupportedError

pytest.importorskip("numba", reason="building kernels.wasm needs llvmlite and numba (the cpu extra)")
pytest.importorskip("wasmtime", reason="the wasm driver runs kernels.wasm under wasmtime (the dev extra)")
from tallow.backends.wasm import build  # noqa: E402
from tallow.backends.wasm.driver_native import WasmtimeDriver  # noqa: E402
from tallow.backends.wasm.program import StepArg, step_words  # noqa: E402

if build.linker() is None:
    pytest.skip("no wasm-ld here: apt-get install lld (scripts/system_deps.sh does) or pip install ziglang",
                allow_module_level=True)


@pytest.fixture
def driver():
    return WasmtimeDriver(build.build())


def _put(driver, array):
    return driver.upload(np.ascontiguousarray(array, np.float32).tobytes(), f32)


def _get(driver, buf, shape):
    return np.frombuffer(driver.download(buf, 0, buf.nbytes), np.float32).reshape(shape)


def test_buffers_are_zeroed_written_and_read_in_their_bounds(driver):
    buf = driver.alloc(f32, 10)
    assert driver.download(buf, 0, 40) == bytes(40)
    driver.write(buf, 8, np.arange(3, dtype=np.float32).tobytes())
    assert _get(driver, buf, (10,)).tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 0, 0]
    with pytest.raises(ShapeError, match=r"bytes \[36, 44\) outside a 40-byte buffer"):
        driver.write(buf, 36, bytes(8))
    with pytest.raises(ShapeError, match="outside"):
        driver.download(buf, -4, 8)


def test_a_buffer_past_wasm32s_memory_is_refused_before_any_allocation(driver):
    with pytest.raises(DeviceError, match="cannot hold a 5368709120-byte buffer: wasm32's memory is at most 4 GiB"):
        driver.alloc_bytes(5 << 30)


def test_a_dropped_buffers_range_is_reused_zeroed(driver):
    first = _put(driver, np.ones(16))
    at = first.at
    del first
    again = driver.alloc(f32, 16)
    assert again.at == at and driver.download(again, 0, 64) == bytes(64)


def test_an_eager_launch_computes_like_numpy(driver):
    rng = np.random.default_rng(1)
    g, u = rng.standard_normal(100).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    out = driver.alloc(f32, 100)
    driver.launch("silu_mul", [_put(driver, g), _put(driver, u), 100, out])
    g64 = g.astype(np.float64)
    assert np.allclose(_get(driver, out, (100,)), g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)


def test_unknown_kernels_and_wrong_arities_name_the_device(driver):
    with pytest.raises(UnsupportedError, match="the wasm device cannot launch it: wasm program: no kernel 'conv2d'"):
        driver.launch("conv2d", [1])
    with pytest.raises(UnsupportedError, match="silu takes 3 arguments, got 2"):
        driver.launch("silu", [1, 2])
    with pytest.raises(UnsupportedError, match="records kernel calls only"):
        driver.record([("launch", "x", (1, 1, 1), (1, 1, 1), [])])


def test_a_missing_module_is_one_clear_error(tmp_path):
    with pytest.raises(DeviceError, match="needs kernels.wasm .* run `make wasm`"):
        WasmtimeDriver(str(tmp_path / "kernels.wasm"))


def test_a_recorded_step_replays_like_its_eager_launches(driver):
    """A decode-shaped step (write the token's k/v into its cache slot, attend over the slots so
    far, add a residual) recorded once with StepArgs, replayed at positions 0..4 with the step
    words rewritten: bit for bit what the same launches do eagerly at each position."""
    rng = np.random.default_rng(2)
    heads, d, capacity = 2, 16, 8
    ks = rng.standard_normal((5, d)).astype(np.float32)

    def state():
        return dict(k=driver.alloc(f32, d), q=_put(driver, rng.standard_normal((heads, d))),
                    kc=driver.alloc(f32, capacity * d), vc=driver.alloc(f32, capacity * d),
                    scores=driver.alloc(f32, capacity), out=driver.alloc(f32, heads * d))

    def launches(s):
        return [("call", "copy_f32", [s["k"], d, StepArg(s["kc"], d * 4)]),
                ("call", "copy_f32", [s["k"], d, StepArg((s["vc"], 0), d * 4)]),
                ("call", "cache_attention", [s["q"], heads, 1, d, s["kc"], s["vc"], capacity, StepArg(1, 1), 0.25,
                                             s["scores"], s["out"]]),
                ("call", "add_f32", [s["out"], (s["out"], d * 4), d, s["out"]])]

    replayed, eager = state(), state()
    driver.write(eager["q"], 0, driver.download(replayed["q"], 0, heads * d * 4))
    handle = driver.record(launches(replayed))
    for pos in range(5):
        for s in (replayed, eager):
            driver.write(s["k"], 0, ks[pos].tobytes())
        driver.write(driver.step, 0, step_words(pos))
        driver.replay(handle)
        for entry in launches(eager):
            driver.launch(entry[1], entry[2])
        for name, shape in (("out", (heads, d)), ("kc", (capacity, d)), ("vc", (capacity, d))):
            assert np.array_equal(_get(driver, replayed[name], shape), _get(driver, eager[name], shape))
    assert np.array_equal(_get(driver, replayed["kc"], (capacity, d))[:5], ks)


def test_the_shared_driver_case_against_a_float64_reference(driver):
    """tests/wasm_driver_cases.py, which the browser driver runs in Chromium too."""
    from wasm_driver_cases import attention_reference, close, recorded_step_replays_like_its_eager_launches
    att, ks, q = recorded_step_replays_like_its_eager_launches(driver)
    assert close(att, attention_reference(ks, q))


def test_a_recording_keeps_its_buffers_alive(driver):
    out = driver.alloc(f32, 4)
    handle = driver.record([("call", "silu", [_put(driver, np.full(4, 2.0)), 4, out])])
    import gc
    gc.collect()  # the input buffer has no other holder: the recording keeps its range
    fresh = driver.alloc(f32, 4)
    driver.write(fresh, 0, np.full(4, 9.0, np.float32).tobytes())
    driver.replay(handle)
    assert np.allclose(_get(driver, out, (4,)), 2 / (1 + np.exp(-2.0)), rtol=1e-6)
