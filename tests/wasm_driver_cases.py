"""Cases both wasm drivers must pass (WasmtimeDriver natively, BrowserWasmDriver in Chromium's
Pyodide, where this file's text is run as it is): standard library only, no numpy."""
import math
from array import array

from tallow.backends.wasm.program import StepArg, step_words
from tallow.dtypes import f32


def _floats(driver, buf):
    return array("f", driver.download(buf, 0, buf.nbytes))


def _put(driver, values):
    return driver.upload(array("f", values).tobytes(), f32)


def recorded_step_replays_like_its_eager_launches(driver):
    """A decode-shaped step (the token's k/v into its cache slot, attention over the slots so far,
    a residual add) recorded once with StepArgs, replayed at positions 0..4 with the step words
    rewritten: bit for bit what the same launches do eagerly at each position. Returns the
    attention output of the last step (the callers check it against a reference)."""
    heads, d, capacity = 2, 16, 8
    ks = [[math.sin(0.7 * p + 0.3 * i) for i in range(d)] for p in range(5)]
    q = [math.cos(0.5 * i) for i in range(heads * d)]

    def state():
        return dict(k=driver.alloc(f32, d), q=_put(driver, q), kc=driver.alloc(f32, capacity * d),
                    vc=driver.alloc(f32, capacity * d), scores=driver.alloc(f32, capacity),
                    out=driver.alloc(f32, heads * d), att=driver.alloc(f32, heads * d))

    def launches(s):
        return [("call", "copy_f32", [s["k"], d, StepArg(s["kc"], d * 4)]),
                ("call", "copy_f32", [s["k"], d, StepArg((s["vc"], 0), d * 4)]),
                ("call", "cache_attention", [s["q"], heads, 1, d, s["kc"], s["vc"], capacity, StepArg(1, 1), 0.25,
                                             s["scores"], s["att"]]),
                ("call", "add_f32", [s["att"], (s["att"], d * 4), d, s["out"]])]

    replayed, eager = state(), state()
    handle = driver.record(launches(replayed))
    for pos in range(5):
        for s in (replayed, eager):
            driver.write(s["k"], 0, array("f", ks[pos]).tobytes())
        driver.write(driver.step, 0, step_words(pos))
        driver.replay(handle)
        for entry in launches(eager):
            driver.launch(entry[1], entry[2])
        for name in ("att", "out", "kc", "vc"):
            assert driver.download(replayed[name], 0, replayed[name].nbytes) == \
                driver.download(eager[name], 0, eager[name].nbytes), (pos, name)
    assert list(_floats(driver, replayed["kc"]))[:5 * d] == list(array("f", [v for row in ks for v in row]))
    return list(_floats(driver, replayed["att"])), ks, q


def attention_reference(ks, q, heads=2, d=16, scale=0.25):
    """Each head's query over the five keys (k = v here), in float64."""
    out = []
    for h in range(heads):
        qh = q[h * d:(h + 1) * d]
        logits = [scale * sum(a * b for a, b in zip(qh, k)) for k in ks]
        top = max(logits)
        e = [math.exp(x - top) for x in logits]
        out += [sum(w * k[i] for w, k in zip(e, ks)) / sum(e) for i in range(d)]
    return out


def close(got, want, rel=1e-5):
    return all(abs(g - w) <= rel * max(abs(w), 1e-3) for g, w in zip(got, want)) and len(got) == len(want)


def huge_buffer_is_refused(driver):
    """A buffer past wasm32's 4 GiB: a DeviceError saying so, before anything is allocated."""
    from tallow.errors import DeviceError
    try:
        driver.alloc_bytes(5 << 30)
    except DeviceError as e:
        return "wasm32's memory is at most 4 GiB" in str(e)
    return False
