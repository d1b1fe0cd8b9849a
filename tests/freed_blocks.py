"""A child-process probe of glibc's allocation policy: the resident bytes left after freeing
written blocks of 8, 8 and 6 MB, in a process set up by `setup` (Python lines)."""
import subprocess
import sys

_PROBE = """
import numpy as np
{setup}
def rss():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024
before = rss()
for mb in (8, 8, 6):  # under glibc's own policy the threshold grows to the largest block freed
    a = np.ones(mb << 18, np.float32)  # written
    del a
print(rss() - before)
"""


def resident_after_freeing(setup):
    """Bytes still resident after the frees (the child's stdout); fails on the child's error."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(setup=setup)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)
