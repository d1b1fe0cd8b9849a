"""Which kernel runs matmuls of more than one row (prefill, Whisper's encoder) on this adapter.

Two kernel families have candidates: float matmuls ("matmul f32", "matmul f16") and quantised
prefill ("qmatmul q4_1", ... one per in-kernel block format). "simple" is the kernel tuned on
lavapipe (matmul.wgsl / matmul_rows.wgsl, qmatmul.wgsl: registers only, no barriers);
"tiled64" / "tiled32" are the workgroup-tiled kernels (matmul_tiled.wgsl, qmatmul_tiled.wgsl:
shared-memory tiles, 4x4 register blocks) that real GPUs want.

The choice is made by measurement, once per (family, adapter): the first time a family is
needed (natively, outside a capture), or for every family with `tallow gpu tune`, each
candidate is timed on a Linear-layer shape, growing the shape until the fastest run takes
MIN_RUN_S, within BUDGET_S in all. The winner is kept per adapter (vendor, architecture,
device, driver description) in $TALLOW_HOME/wgpu_tuning.json; a missing, unreadable or
foreign entry is measured again, never an error. $TALLOW_WGPU_MATMUL=simple|tiled|tiled64|tiled32
forces a choice for every family (tests, users).

Where nothing is measured -- in the browser (no blocking readback in its hot path), inside a
capture, on the do-nothing driver -- an unmeasured family takes DEFAULT_CPU ("simple") on a
CPU-emulated adapter (lavapipe, SwiftShader) and DEFAULT_GPU ("tiled64") on any other.
"""
import json
import os
import sys
import threading
import time

from tallow.backends.gpu_plan import IN_KERNEL_QUANTS
from tallow.settings import settings

from . import wgsl

ENV = "TALLOW_WGPU_MATMUL"
CACHE_FILE = "wgpu_tuning.json"
CACHE_VERSION = 1
# (rows, K, N) of the timed matmul, smallest first: a short prefill through a Linear layer.
SHAPES = ((128, 256, 256), (256, 512, 512), (512, 1024, 1024))
MIN_RUN_S = 0.002  # a faster best run is mostly launch overhead: measure the next shape
BUDGET_S = 0.8  # one family's measurement, compiles included, stays under a second
REPS = 2
# name -> (BM, BN, BK): output tile rows and columns per workgroup, K per step (4x4 outputs per thread)
TILES = {"tiled64": (64, 64, 16), "tiled32": (32, 32, 16)}
CANDIDATES = {"matmul": ("simple", "tiled64", "tiled32"), "qmatmul": ("simple", "tiled64")}
DEFAULT_CPU, DEFAULT_GPU = "simple", "tiled64"


def family_kind(family):
    """"matmul" or "qmatmul" for a family name such as "qmatmul q4_1"."""
    return family.split(" ", 1)[0]


def tile_subs(name, bk=None):
    """WGSL substitutions of tile configuration `name` (a key of TILES) for the tiled kernels."""
    bm, bn, tile_k = TILES[name]
    bk = bk or tile_k
    aw, bw = bm // 4 + 1, bn // 4 + 1
    return {"BM": str(bm), "BN": str(bn), "BK": str(bk), "AW": str(aw), "BW": str(bw),
            "THREADS": str(bm * bn // 16), "TX": str(bn // 4), "TY": str(bm // 4),
            "A_TILE": str(bk * aw), "B_TILE": str(bk * bw)}


def fits(name, limits, bk=None):
    """Whether tile configuration `name` fits the adapter's workgroup limits."""
    if name == "simple":
        return True
    bm, bn, tile_k = TILES[name]
    shared = 16 * (bk or tile_k) * (bm // 4 + 1 + bn // 4 + 1)
    return bm * bn // 16 <= limits.get("max_invocations", 256) and shared <= limits.get("max_workgroup_storage", 16384)


def adapter_key(driver):
    """What identifies an adapter and its driver in the cache."""
    info = driver.info
    parts = [info.get(k, "") for k in ("vendor", "architecture", "adapter", "description", "backend_type")]
    return " | ".join(str(p) for p in parts)


def cache_path():
    """$TALLOW_HOME/wgpu_tuning.json (tallow.settings: the folder tallow.hub caches models in)."""
    return os.path.join(settings().home, CACHE_FILE)


def forced():
    """The candidate $TALLOW_WGPU_MATMUL names ("tiled" meaning tiled64), or None."""
    value = settings().wgpu_matmul  # one of simple, tiled, *TILES: checked there
    return DEFAULT_GPU if value == "tiled" else value


def read_cache(path):
    """The cache file's adapters table; {} when it is missing, unreadable or not ours."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("adapters"), dict):
        return {}
    return data["adapters"]


def cached_choice(adapters, key, family):
    """The cached winner of family on adapter key, or None where the entry is absent or malformed."""
    entry = adapters.get(key)
    entry = entry.get(family) if isinstance(entry, dict) else None
    choice = entry.get("choice") if isinstance(entry, dict) else None
    return choice if choice in CANDIDATES.get(family_kind(family), ()) else None


def write_cache(path, key, family, record):
    """Add one measured family to the cache file (re-read first: other processes may write too).
    A cache that cannot be written costs a re-measurement next time, nothing more."""
    adapters = read_cache(path)
    entry = adapters.get(key)
    entry = entry if isinstance(entry, dict) else {}
    entry[family] = record
    adapters[key] = entry
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": CACHE_VERSION, "adapters": adapters}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class Tuner:
    """One backend's kernel choices. clock: seconds (time.perf_counter; tests pass a fake one);
    measure: whether an unmeasured family is measured on first use (default: natively, on a
    driver that really computes). Of the backend it uses only public names: driver, limits,
    has_f16, capturing(), from_bytes/full, qmatvec_max_rows, and the kernels it races,
    matmul_with and qmatmul_with."""

    def __init__(self, backend, path=None, clock=time.perf_counter, measure=None):
        self.backend = backend
        self.path = path
        self.clock = clock
        driver = backend.driver
        self.measure_on_first_use = (driver.name == "native" and sys.platform != "emscripten") if measure is None \
            else measure
        self.key = adapter_key(driver)
        self.default = DEFAULT_CPU if driver.cpu_emulated else DEFAULT_GPU
        self.chosen = {}  # family -> candidate, for this backend's life
        self.measured = {}  # family -> what measure() recorded, for `tallow gpu tune` and benches
        self._lock = threading.Lock()  # threads sharing a device measure a family once

    def _path(self):
        return self.path or cache_path()

    # ---- what `tallow gpu tune/show` asks (the CLI reaches this module only through a backend) ----
    def families(self):
        """Every family this adapter can run: float f32 (and f16 with shader-f16), quantised prefill
        per in-kernel block format."""
        return ["matmul f32"] + (["matmul f16"] if self.backend.has_f16 else []) + \
            [f"qmatmul {q}" for q in IN_KERNEL_QUANTS]

    def cached(self, family):
        """The cached record of family on this adapter, or None."""
        entry = read_cache(self._path()).get(self.key)
        record = entry.get(family) if isinstance(entry, dict) else None
        return record if isinstance(record, dict) else None

    def cache_file(self):
        return self._path()

    @staticmethod
    def forced():
        """The kernel $TALLOW_WGPU_MATMUL forces, or None."""
        return forced()

    def candidates(self, family):
        bk = 16 if family_kind(family) == "qmatmul" else None
        return [c for c in CANDIDATES[family_kind(family)] if fits(c, self.backend.limits, bk)]

    def choice(self, family):
        """The kernel for family: forced, remembered, cached, measured now, or the default."""
        force = forced()
        if force is not None:
            return self._nearest(family, force)
        found = self.chosen.get(family)
        if found is not None:
            return found
        with self._lock:
            found = self.chosen.get(family) or cached_choice(read_cache(self._path()), self.key, family)
            if found is None:
                if self.backend.capturing():
                    return self._nearest(family, self.default)  # not remembered: measured after the capture
                measured = self.measure_on_first_use
                found = self.tune(family)["choice"] if measured else self._nearest(family, self.default)
            self.chosen[family] = found
        return found

    def _nearest(self, family, name):
        """name where family has it and it fits the adapter's workgroup limits; else the first
        tiled candidate that fits for a tiled name; else "simple"."""
        allowed = self.candidates(family)
        if name in allowed:
            return name
        tiled = [c for c in allowed if c != "simple"]
        return tiled[0] if name != "simple" and tiled else "simple"

    def tune(self, family):
        """Measure family's candidates now, remember and cache the winner; the record."""
        record = self.measure(family)
        self.chosen[family] = record["choice"]
        self.measured[family] = record
        if record["seconds"]:
            write_cache(self._path(), self.key, family, record)
        return record

    def measure(self, family):
        """{"choice", "seconds": {candidate: best seconds per run}, "shape": [rows, K, N]}."""
        record = {"choice": self.default, "seconds": {}, "shape": None}  # no shape fits a binding
        start = None
        for shape in SHAPES:
            if not operands_fit(self.backend, family, shape):
                break
            run = runner(self.backend, family, shape)
            if start is None:
                # The budget starts after one untimed run: a device's first work (lavapipe compiles
                # on first dispatch) is paid by whichever matmul comes first, measured or not.
                run(self.candidates(family)[0], 1)
                start = self.clock()
            seconds = {}
            for name in self.candidates(family):
                if seconds and self.clock() - start > BUDGET_S:
                    break  # out of time: the candidates left are not chosen
                t = self._time(run, name, seconds)
                if t is not None:
                    seconds[name] = t
            record = {"choice": min(seconds, key=seconds.get), "seconds": seconds, "shape": list(shape)}
            if min(seconds.values()) >= MIN_RUN_S or self.clock() - start > BUDGET_S / 4:
                break  # long enough to be a fair race, or no time for a bigger shape
        return record

    def _time(self, run, name, seconds):
        """Best seconds per run of candidate name; None if one run (after a first, which compiles
        the kernel) shows it cannot win: slower than 4x the best so far."""
        run(name, 1)
        t0 = self.clock()
        run(name, 1)
        first = self.clock() - t0
        if seconds and first > 4 * min(seconds.values()):
            return None
        t0 = self.clock()
        run(name, REPS)
        return min(first, (self.clock() - t0) / REPS)

def operands_fit(backend, family, shape):
    """Whether the timed matmul's operands each fit one storage binding (a lowered
    $TALLOW_WGPU_MAX_BINDING_MB may not leave room)."""
    from tallow import dtypes
    m, k, n = shape
    kind, what = family.split(" ", 1)
    esize = 4 if kind == "qmatmul" else wgsl.elem_size(dtypes.get_dtype(what), backend.has_f16)
    weight = dtypes.get_dtype(what).nbytes(n * k) if kind == "qmatmul" else esize * n * k
    return max(weight, esize * m * max(k, n)) <= backend.limits["max_storage_binding"]


def runner(backend, family, shape):
    """run(candidate, reps): `reps` launches of family's candidate on a (rows, K, N) Linear-layer
    matmul of zeros (timing does not depend on the values), then one readback (the sync point)."""
    from tallow import dtypes
    m, k, n = shape
    kind, what = family.split(" ", 1)
    if kind == "qmatmul":
        assert m > backend.qmatvec_max_rows, "qmatmul's candidates serve prefills longer than the qmatvec threshold"
        wdtype = dtypes.get_dtype(what)
        x, y = backend.from_bytes(bytes(4 * m * k), dtypes.f32), backend.full(m * n, 0, dtypes.f32)
        w = backend.from_bytes(bytes(wdtype.nbytes(n * k)), wdtype)

        def launch(name):
            backend.qmatmul_with(name, w, x, y, m, n, k, wdtype.nbytes(k), 0, dtypes.f32, wdtype)
    else:
        dtype = dtypes.get_dtype(what)
        esize = wgsl.elem_size(dtype, backend.has_f16)
        a, b = backend.from_bytes(bytes(esize * m * k), dtype), backend.from_bytes(bytes(esize * n * k), dtype)
        y = backend.full(m * n, 0, dtype)
        words = [m, n, k, 1, 0, 0, k, 1, 0, 0, 1, k]  # x (m, k) . w^T, w (n, k): a Linear layer

        def launch(name):
            backend.matmul_with(name, a, b, y, words, dtype)

    def run(name, reps):
        for _ in range(reps):
            launch(name)
        backend.driver.download(y.buf, 0, 4)

    return run
