"""Hand back to the OS the pages of LLVM's library (libllvmlite, or libLLVM) that numba touched while it
loaded or compiled kernels: they are not used again until the next load or compile.

Importing numba and loading the first cached kernel touch 68 MB of libllvmlite's code and
read-only data (measured with /proc/self/smaps), which stayed in the process's resident
memory for its whole life: a fifth of a SmolLM2-135M Q4_1 run's peak RSS. Decoding never
runs that code. `release()` tells the kernel with madvise(MADV_DONTNEED) that those pages
are not needed; they stay in the page cache, and the next compile or load faults the ones
it needs back in (minor faults, no disk read while the cache holds them).

Only mappings of the library that are not writable and have no private dirty page are
released: their pages are exactly the file's, so dropping them loses nothing (a writable
or relocated mapping is skipped). Linux only; elsewhere, or when /proc or madvise is not
available, release() does nothing.
"""
import sys

# llvmlite's library (pip wheels link LLVM into it; conda builds load a separate libLLVM)
LIBRARIES = ("libllvmlite", "libLLVM")
MADV_DONTNEED = 4
_libc: list = []  # [the C library's madvise, or None when it cannot be loaded]
# The library's clean read-only ranges, found once: a non-writable mapping cannot become dirty,
# and the library stays loaded (reading /proc/self/smaps took 10-15 ms; madvise alone well under 1).
_ranges: list = []


def _madvise():
    if not _libc:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _libc.append(fn)
        except (OSError, AttributeError):
            _libc.append(None)
    return _libc[0]


def clean_ranges(smaps_text, libraries=LIBRARIES):
    """(start, end) of each mapping of one of `libraries` in smaps_text that is not writable and has no
    private or shared dirty page."""
    ranges, current = [], None
    for line in smaps_text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's first line
            current = None
            path = head[5] if len(head) > 5 else ""
            name = path.rsplit("/", 1)[-1]
            if name.startswith(libraries) and "w" not in head[1]:
                start, end = (int(a, 16) for a in head[0].split("-"))
                current = [start, end, True]
                ranges.append(current)
        elif current is not None and line.startswith(("Private_Dirty:", "Shared_Dirty:")):
            if int(line.split()[1]) != 0:
                current[2] = False
    return [(start, end) for start, end, clean in ranges if clean]


def release():
    """madvise(MADV_DONTNEED) on LLVM's clean read-only mappings. Returns the bytes
    advised (0 when nothing was, or on a system without /proc/self/smaps or madvise)."""
    if not sys.platform.startswith("linux"):
        return 0
    fn = _madvise()
    if fn is None:
        return 0
    if not _ranges:
        try:
            with open("/proc/self/smaps") as f:
                found = clean_ranges(f.read())
        except OSError:
            return 0
        if not found:  # the library is not loaded yet: look again next time
            return 0
        _ranges.extend(found)
    done = 0
    for start, end in _ranges:
        if fn(start, end - start, MADV_DONTNEED) == 0:
            done += end - start
    return done
