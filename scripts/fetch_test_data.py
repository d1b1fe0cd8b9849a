"""Download every model and data file the test suite and benchmarks use into
$TALLOW_HOME (default ~/.cache/tallow). Idempotent: a rerun returns at once.

    python scripts/fetch_test_data.py            # all of them
    python scripts/fetch_test_data.py jfk.wav    # just some
"""
import sys

from tallow.cli import main
from tallow.hub import KNOWN

if __name__ == "__main__":
    sys.exit(main(["fetch", *(sys.argv[1:] or list(KNOWN))]))
