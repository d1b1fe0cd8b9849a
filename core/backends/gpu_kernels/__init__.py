"""The CUDA C and MSL kernels, written once.

Each module (<module>.kernels) is written in a small dialect (described at the top of
common.h) that cuda.h and msl.h spell out for their language: kernel signatures with
Metal's buffer indices, the thread's position, address-space qualifiers, barriers,
atomics, warp sums, and what the language has (f64, 64-bit atomics). `source()` puts the
language's header, common.h and the module into one text, which is what NVRTC, nvcc,
Metal and the CPU emulators compile (none of them is given an include path). Kernels only
one language has live in that backend's own kernels/ folder and are assembled the same way.
"""
import os

DIR = os.path.dirname(os.path.abspath(__file__))
MODULES = ("elementwise", "reduce", "index", "attention", "quant")
HEADERS = {"cuda": "cuda.h", "msl": "msl.h"}


def module_path(module):
    return os.path.join(DIR, module + ".kernels")


def source(language, module_file):
    """The compilable text of one kernel file for `language` ("cuda" or "msl"): the language's
    header, common.h, then the file, each after a #line mark so that compiler messages name
    the file and line they come from."""
    parts = []
    for path in (os.path.join(DIR, HEADERS[language]), os.path.join(DIR, "common.h"), module_file):
        with open(path) as f:
            parts.append(f'#line 1 "{os.path.basename(path)}"\n{f.read()}')
    return "\n".join(parts)
