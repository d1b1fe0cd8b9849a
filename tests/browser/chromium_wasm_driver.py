"""The wasm device's kernels in Chromium's V8, driven from the test process: ChromiumWasmDriver is
driver.WasmDriver (the driver both devices' twins share) whose memory hooks talk to driver.js's
makeTallowWasm instance over kernels.wasm inside a headless Chromium page (WebGPU disabled), through
Playwright's sync API. tests/conftest.py registers it as the conformance suite's "wasm-chromium"
device: a WasmBackend over this driver, so every conformance test that runs on "wasm" (wasmtime)
also runs with its kernels executing in the browser, where the page's Pyodide (no numpy) cannot run
the suite's numpy-based tests itself.

    with ChromiumWasm() as chromium:          # one headless Chromium, one blank page
        driver = chromium.driver()            # a fresh makeTallowWasm instance (its own memory)
        backend = WasmBackend(driver)

Round trips are few: allocations, writes, zeroing and export calls are queued in Python and sent
to the page in one page.evaluate when something must come back (a read, the memory's size), or
when the queue holds many bytes. The allocator is driver.js's bump allocator mirrored here (its
next address is known, so an alloc needs no answer); the page checks each address it hands out
against the mirrored one. A trap in a queued call is raised by the flush that ran it, naming the
export and its arguments. Bytes travel as base64.
"""
import base64
import os
import queue
import threading

from tallow.backends.wasm import driver as wasm_driver
from tallow.backends.wasm.driver import ALIGN, MEMORY_LIMIT, WasmDriver
from tallow.errors import DeviceError

WASM_DIR = os.path.dirname(os.path.abspath(wasm_driver.__file__))
KERNELS = os.path.join(WASM_DIR, "kernels.wasm")
DRIVER_JS = os.path.join(WASM_DIR, "driver.js")
# --disable-webgpu: navigator.gpu is there, its adapter null (nothing of the page runs on WebGPU)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-webgpu"]
FLUSH_BYTES = 8 << 20  # queued write bytes that force a flush (bounds one evaluate's message)

# In the page: window.__tallowWasm[id] are makeTallowWasm instances; flush runs a queue of ops.
_SETUP = """async ([source, wasm64]) => {
    const factory = (new Function(source))();
    const bin = atob(wasm64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const kernels = await factory(bytes, null, 1);
    window.__tallowWasm = window.__tallowWasm || [];
    window.__tallowWasm.push(kernels);
    const toB64 = (u8) => {
        let s = "";
        for (let i = 0; i < u8.length; i += 32768) s += String.fromCharCode.apply(null, u8.subarray(i, i + 32768));
        return btoa(s);
    };
    const fromB64 = (text) => {
        const bin = atob(text), out = new Uint8Array(bin.length);
        for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
        return out;
    };
    window.__tallowFlush = window.__tallowFlush || ((id, ops) => {
        const k = window.__tallowWasm[id];
        const out = [];
        for (let i = 0; i < ops.length; i++) {
            const op = ops[i];
            try {
                switch (op[0]) {
                    case "a": { const at = k.alloc(op[1]);
                                if (at !== op[2]) throw new Error(`alloc gave ${at}, the mirror expected ${op[2]}`);
                                break; }
                    case "w": k.write(op[1], fromB64(op[2])); break;
                    case "z": k.zero(op[1], op[2]); break;
                    case "c": k.call(op[1], op[2]); break;
                    case "r": out.push(toB64(k.read(op[1], op[2]))); break;
                    case "m": out.push(k.memoryBytes()); break;
                    default: throw new Error(`unknown op ${op[0]}`);
                }
            } catch (err) {
                return { failed: i, error: String(err && err.stack || err), out };
            }
        }
        return { out };
    });
    return { id: window.__tallowWasm.length - 1, table: kernels.table, next: kernels.alloc(0),
             threads: kernels.threads, userAgent: navigator.userAgent };
}"""


def missing_requirements(chromium):
    """Why the Chromium wasm device cannot run here, or None."""
    if not os.path.exists(chromium):
        return f"no Chromium at {chromium} (apt-get install -y chromium, or set $TALLOW_CHROMIUM)"
    if not os.path.exists(KERNELS):
        return f"the wasm device needs kernels.wasm ({KERNELS} is missing): run `make wasm`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install playwright; never `playwright install`)"
    return None


class ChromiumWasm:
    """One headless Chromium (launched here, closed on exit) with one blank page that holds
    makeTallowWasm instances. Playwright runs on a thread of its own: its sync API keeps an event
    loop current on the thread that started it, so on the main thread it would refuse the other
    browser tests' own sync_playwright while this one is open."""

    def __init__(self, chromium):
        self.chromium = chromium
        self.round_trips = 0  # page.evaluate calls made by every driver of this page
        self._requests = queue.Queue()
        self._thread = None

    def _serve(self, started):
        from playwright.sync_api import sync_playwright
        try:
            playwright = sync_playwright().start()
        except BaseException as e:
            started.put(e)
            return
        browser = None
        try:
            browser = playwright.chromium.launch(headless=True, executable_path=self.chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page()
            page.goto("about:blank")
            started.put(None)
            while True:
                request = self._requests.get()
                if request is None:
                    return
                script, arg, reply = request
                try:
                    reply.put((True, page.evaluate(script, arg)))
                except BaseException as e:
                    reply.put((False, e))
        except BaseException as e:
            started.put(e)
        finally:
            try:
                if browser is not None:
                    browser.close()
            finally:
                playwright.stop()

    def __enter__(self):
        started = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="chromium-wasm", daemon=True)
        self._thread.start()
        error = started.get()
        if error is not None:
            self._thread.join()
            raise error
        return self

    def __exit__(self, *exc):
        if self._thread is not None and self._thread.is_alive():
            self._requests.put(None)
            self._thread.join(timeout=60)

    def evaluate(self, script, arg=None):
        if self._thread is None or not self._thread.is_alive():
            raise DeviceError("the Chromium of the wasm-chromium device is not running")
        reply = queue.Queue()
        self._requests.put((script, arg, reply))
        self.round_trips += 1
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def driver(self):
        with open(DRIVER_JS, encoding="utf-8") as f:
            source = f.read()
        with open(KERNELS, "rb") as f:
            wasm64 = base64.b64encode(f.read()).decode("ascii")
        return ChromiumWasmDriver(self, self.evaluate(_SETUP, [source, wasm64]))


class ChromiumWasmDriver(WasmDriver):
    name = "chromium"

    def __init__(self, chromium, setup):
        self.chromium = chromium
        self.id = setup["id"]
        self.table = int(setup["table"])
        self.user_agent = setup["userAgent"]
        self._next = int(setup["next"])  # driver.js's bump allocator, mirrored
        self._queue = []
        self._queued_bytes = 0
        self._start()

    def _flush(self, *wanted):
        """Send the queued ops and `wanted` (ops whose answers come back) in one evaluate."""
        ops, self._queue, self._queued_bytes = self._queue + list(wanted), [], 0
        if not ops:
            return []
        got = self.chromium.evaluate("([id, ops]) => window.__tallowFlush(id, ops)", [self.id, ops])
        if "failed" in got:
            op = ops[got["failed"]]
            what = f"call of {op[1]}{tuple(op[2])}" if op[0] == "c" else f"{op[0]!r} op at {op[1]}"
            raise DeviceError(f"kernels.wasm in Chromium: the {what} failed: {got['error']}")
        return got["out"]

    def _queue_op(self, op, nbytes=0):
        self._queue.append(op)
        self._queued_bytes += nbytes
        if self._queued_bytes >= FLUSH_BYTES:
            self._flush()

    def _alloc_range(self, nbytes):
        at = self._next
        end = -(-(at + nbytes) // ALIGN) * ALIGN
        if end > MEMORY_LIMIT:
            raise DeviceError(f"the wasm device's memory cannot take {nbytes} more bytes: wasm32 holds 4 GiB")
        self._next = end
        self._queue_op(["a", nbytes, at])  # fresh memory is zero
        return at

    def _memory_bytes(self):
        return int(self._flush(["m"])[0])

    def _read(self, at, nbytes):
        return base64.b64decode(self._flush(["r", at, nbytes])[0])

    def _write(self, at, data):
        self._queue_op(["w", at, base64.b64encode(data).decode("ascii")], len(data))

    def _zero(self, at, nbytes):
        self._queue_op(["z", at, nbytes])

    def _call(self, export, args):
        self._queue_op(["c", export, [a if isinstance(a, float) else int(a) for a in args]])
