"""OpenBLAS settings that must be in the environment before numpy loads OpenBLAS.

OPENBLAS_THREAD_TIMEOUT=4: after each product, OpenBLAS's helper threads wait
2**4 polling cycles instead of its default 2**28 (about 0.1 s of a spinning
core) before they sleep. On a box that also runs other work (an edge box, a
shared server) the spinning threads take cores the next op needs: measured on a
busy 2-core box, a 2-thread Whisper tiny.en transcription of jfk.wav used
1.56-1.68 s of CPU with OpenBLAS's default and 1.17-1.18 s with 4.
With the encoder's attention off BLAS's threads (cpu_attention.py), bench/whisper.py
at 2 threads, best of 3: tallow f32 0.70 s of CPU with 4, 0.95 s with 28 (the
default); at 1 thread OpenBLAS starts no helper threads and the setting changes nothing.

Importing this module applies them (tallow's numpy backend and CLI import it
before numpy). Set only with setdefault (a value the user exported wins), and only when numpy
is not imported yet: OpenBLAS reads it once, when numpy loads it; later it does
nothing, so we change nothing then.
"""
import os
import sys

SETTINGS = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def apply():
    """Put SETTINGS into os.environ where unset, if numpy has not been imported yet."""
    if "numpy" in sys.modules:
        return
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)


apply()
