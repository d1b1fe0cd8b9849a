"""Prepare numba for tallow's kernels: no scipy BLAS import, and LLVM's pages handed back
after each kernel load or compile.

The first time numba compiles or loads a cached kernel, its CPU target imports
numba.np.arraymath, whose import-time check `_check_blas()` imports
scipy.linalg.cython_blas when scipy is installed. tallow's kernels never call
BLAS from numba (np.dot and np.linalg are not used in any njit function: BLAS
runs from numpy, outside the kernels), yet that import alone cost a
SmolLM2-135M Q4_1 first token 0.2 s and 15 MB of peak RSS (scipy.linalg and its
Fortran libraries; measured).

`prepare()` imports numba.np.arraymath while scipy.linalg.cython_blas is
marked absent in sys.modules, so the check finds no BLAS, then lifts the mark.
What that changes in numba: only np.correlate and np.convolve inside njit code
use numba's own loop instead of BLAS (same values); np.dot, np.linalg and the
rest call `ensure_blas()` when such code is compiled, which imports scipy then.
When scipy.linalg is already imported (the user's code loaded it), nothing is
blocked. The mark lasts for that one import only (about 0.1 s, when the
kernels are first imported): another thread importing scipy.linalg.cython_blas
at that very moment would get an ImportError.

`prepare()` also registers a listener on numba's compiler lock: when the outermost
load or compile of a kernel ends, llvm_pages.release() hands libllvmlite's clean
pages back (68 MB of a SmolLM2-135M Q4_1 run's peak RSS; each later kernel load
faults about 11 MB of them back in, in about 8 ms, measured).
"""
import os
import sys

from . import llvm_pages

_HERE = os.path.dirname(os.path.abspath(__file__))

BLAS_MODULE = "scipy.linalg.cython_blas"
_done: list = []


def prepare():
    """Once per process: numba's array-maths registry imported without scipy's BLAS, and
    LLVM's pages released after every kernel load or compile."""
    if _done:
        return
    _stamp_caches_with_all_sources()
    _import_arraymath()
    _release_llvm_pages_after_loads()
    _done.append(True)


def _sources_digest():
    """A hash of every .py file of this package (the kernels' sources, as machine_code's key)."""
    import glob
    import hashlib
    h = hashlib.blake2b(digest_size=20)
    for path in sorted(glob.glob(os.path.join(_HERE, "*.py"))):
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _stamp_caches_with_all_sources():
    """numba's on-disk cache stamps a kernel with its own file's contents, but the kernels inline
    other files' IR (vector_ir.py, kquant_ir.py): after an edit there, numba loaded the stale
    cached kernel and machine_code compiled it under the new key (seen: a prefetch added to
    vector_ir missing from every compiled product). For this package's files the stamp is the
    hash of all of them, so any edit here compiles every kernel again. numba's own locators
    choose where the cache lives ($NUMBA_CACHE_DIR, __pycache__, the user's cache folder);
    kernel modules call prepare() before their first njit."""
    from numba.core import caching
    classes = caching.CacheImpl._locator_classes
    if any(getattr(c, "_tallow_sources", False) for c in classes):
        return
    digest = _sources_digest()

    def stamped(base):
        class Locator(base):
            _tallow_sources = True

            @classmethod
            def from_function(cls, py_func, py_file):
                if os.path.dirname(os.path.abspath(py_file)) != _HERE:
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return digest
        Locator.__name__ = f"AllSources{base.__name__}"
        return Locator
    bases = [c for c in classes if c.__name__ in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                                   "UserWideCacheLocator")]
    classes[:0] = [stamped(b) for b in bases]


def _release_llvm_pages_after_loads():
    from numba.core import event
    from numba.core.compiler_lock import global_compiler_lock

    class ReleaseAfterLoad(event.Listener):
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            if not global_compiler_lock.is_locked():  # this thread's outermost load or compile has ended
                llvm_pages.release()
    event.register("numba:compiler_lock", ReleaseAfterLoad())


def _import_arraymath():
    if "numba.np.arraymath" in sys.modules:
        return
    if BLAS_MODULE in sys.modules:  # already paid for: numba may as well use it
        import numba.np.arraymath  # noqa: F401
        return
    sys.modules[BLAS_MODULE] = None  # `import scipy.linalg.cython_blas` raises ImportError, importing nothing
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if BLAS_MODULE in sys.modules and sys.modules[BLAS_MODULE] is None:
            del sys.modules[BLAS_MODULE]
