"""The installed `tallow` console script, as a user runs it (pip writes it beside this Python)."""
import shutil
import sys
from pathlib import Path

import pytest


def entry_point():
    script = Path(sys.executable).with_name("tallow")
    found = str(script) if script.exists() else shutil.which("tallow")
    if not found:
        pytest.fail("the `tallow` console script is not installed: pip install -e . (make setup does it)")
    return found
