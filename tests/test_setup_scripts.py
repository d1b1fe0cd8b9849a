"""The set-up recipe a fresh box runs first (`make demo` / `make test` -> scripts/system_deps.sh),
exercised with stub `apt-get`, `sudo` and `id` commands on PATH that record their arguments:
as root without sudo, as a user with sudo, as a user without sudo, and on a box without apt-get."""
import os
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "system_deps.sh")
BASH = shutil.which("bash")


def _stub(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture
def box(tmp_path):
    """A PATH holding only the basic tools (no chromium, ffmpeg, node, npm) plus stubs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("ls", "cat", "env", "sh"):
        os.symlink(shutil.which(tool), bin_dir / tool)

    def make(uid, sudo=True, apt=True):
        _stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}')
        if apt:
            _stub(bin_dir, "apt-get", f'echo "apt-get $* DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> {log}')
        if sudo:
            _stub(bin_dir, "sudo", f'echo "sudo $1" >> {log}; exec "$@"')
        proc = subprocess.run([BASH, SCRIPT], capture_output=True, text=True, timeout=30,
                              env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
        calls = log.read_text().splitlines() if log.exists() else []
        return proc, calls
    return make


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_as_root_without_sudo_installs_with_apt_get_directly(box):
    proc, calls = box(uid=0, sudo=False)
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == "apt-get update -qq DEBIAN_FRONTEND=noninteractive"
    install = calls[1]
    assert install.startswith("apt-get install -y -qq --no-install-recommends ")
    for pkg in ("chromium", "ffmpeg", "nodejs", "npm", "lld"):  # (lavapipe is looked up on the real disk)
        assert pkg in install.split(), install
    assert install.endswith("DEBIAN_FRONTEND=noninteractive")


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_as_a_user_with_sudo_goes_through_sudo(box):
    proc, calls = box(uid=1000, sudo=True)
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == "sudo env" and calls[2] == "sudo env", calls
    assert calls[1].startswith("apt-get update") and calls[3].startswith("apt-get install"), calls
    assert all(c.endswith("DEBIAN_FRONTEND=noninteractive") for c in calls if c.startswith("apt-get")), calls


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_without_root_or_sudo_says_what_to_install(box):
    proc, calls = box(uid=1000, sudo=False)
    assert proc.returncode == 1 and calls == []
    assert "missing chromium ffmpeg nodejs npm lld" in proc.stderr
    assert "apt-get install -y" in proc.stderr


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_without_apt_get_names_the_missing_packages(box):
    proc, calls = box(uid=0, sudo=False, apt=False)
    assert proc.returncode == 1 and calls == []
    assert "not a Debian/Ubuntu box" in proc.stderr and "chromium" in proc.stderr


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_nothing_to_do_when_everything_is_present(box, tmp_path):
    bin_dir = tmp_path / "bin"
    for tool in ("chromium", "ffmpeg", "node", "npm", "wasm-ld"):
        _stub(bin_dir, tool, "true")
    icd = "/usr/share/vulkan/icd.d"
    if not (os.path.isdir(icd) and any(p.startswith("lvp_icd.") for p in os.listdir(icd))):
        pytest.skip("lavapipe is not installed here, so the script would install it")
    proc, calls = box(uid=1000, sudo=False)
    assert proc.returncode == 0 and calls == [], (proc.stderr, calls)
