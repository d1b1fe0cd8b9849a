"""Outputs appear whole or not at all, and never overwrite the input they are made from."""
import contextlib
import os

import numpy as np
import pytest

import tallow.io as tio
from tallow.errors import Error
from tallow.io.atomic_output import atomic_output, check_output_path, remove_abandoned
from tallow.io.quantize import quantize_file


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old and whole")
    with pytest.raises(RuntimeError):
        with atomic_output(out) as f:
            f.write(b"half of the new")
            raise RuntimeError("killed mid-write")
    assert out.read_bytes() == b"old and whole"
    assert os.listdir(tmp_path) == ["out.bin"]
    with atomic_output(out) as f:
        f.write(b"new")
    assert out.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.bin"]


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)  # exited and reaped: no process has this pid now (barring reuse)
    names = [f".out.txt.{dead_pid}.ab12cd34.tmp",  # a writer killed mid-write
             f".out.txt.{os.getpid()}.ab12cd34.tmp",  # a writer still running: keep
             f".other.txt.{dead_pid}.ab12cd34.tmp",  # another output's: not ours to touch
             "out.txt.notes"]
    for name in names:
        (tmp_path / name).write_text("x")
    remove_abandoned(tmp_path / "out.txt")
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
    remove_abandoned(tmp_path / "missing-folder" / "out.txt")  # nothing to clean: no error


def test_new_file_gets_the_mode_open_would_give(tmp_path):
    mask = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "a.gguf") as f:
            f.write(b"x")
        (tmp_path / "b.gguf").write_bytes(b"x")
    finally:
        os.umask(mask)
    assert os.stat(tmp_path / "a.gguf").st_mode == os.stat(tmp_path / "b.gguf").st_mode


def test_saving_over_a_mapped_file_keeps_the_mapping_readable(tmp_path):
    # Before: open(path, "wb") truncated the file under its own memory map (SIGBUS on the next read).
    path = tmp_path / "m.safetensors"
    first = np.arange(4096, dtype=np.float32).reshape(64, 64)
    tio.save_file({"w": first}, path)
    mapped = tio.open(path)
    tio.save_file({"w": np.zeros((2, 2), np.float32)}, path)
    np.testing.assert_array_equal(np.frombuffer(mapped.raw("w"), np.float32).reshape(64, 64), first)
    np.testing.assert_array_equal(tio.load_file(path)["w"].numpy(), np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("ext", ["gguf", "safetensors"])
def test_writers_leave_the_old_file_when_the_disk_fills(tmp_path, monkeypatch, ext):
    import importlib
    writer_module = importlib.import_module(f"tallow.io.{ext}")
    path = tmp_path / f"w.{ext}"
    tio.save_file({"w": np.ones((2, 32), np.float32)}, path)
    before = path.read_bytes()
    real = writer_module.atomic_output

    class FillingDisk:
        def __init__(self, f):
            self.f, self.writes = f, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 2:
                raise OSError(28, "No space left on device")
            return self.f.write(data)

    @contextlib.contextmanager
    def filling(p):
        with real(p) as f:
            yield FillingDisk(f)

    monkeypatch.setattr(writer_module, "atomic_output", filling)
    with pytest.raises(OSError, match="No space"):
        tio.save_file({"a": np.zeros((8, 32), np.float32), "b": np.zeros((8, 32), np.float32)}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]


def test_quantize_refuses_its_input_under_any_name(tmp_path):
    src = tmp_path / "w.safetensors"
    tio.save_file({"w": np.ones((4, 32), np.float32)}, src)
    before = src.read_bytes()
    os.symlink(src, tmp_path / "link.gguf")
    os.link(src, tmp_path / "hard.gguf")
    for dst in (src, tmp_path / "." / "w.safetensors", tmp_path / "link.gguf", tmp_path / "hard.gguf"):
        with pytest.raises(Error, match="is the input file"):
            quantize_file(src, dst, "q8_0")
    assert src.read_bytes() == before
    quantize_file(src, tmp_path / "out.gguf", "q8_0")
    assert tio.open(tmp_path / "out.gguf").info("w").dtype.name == "q8_0"


def test_output_path_problems_are_named(tmp_path):
    with pytest.raises(Error, match="is a directory"):
        check_output_path(tmp_path)
    with pytest.raises(Error, match="missing.*does not exist"):
        check_output_path(tmp_path / "missing" / "out.gguf")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(Error, match="permission denied"):
            check_output_path(locked / "out.gguf")
