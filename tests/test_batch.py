"""Batch transcription (tallow transcribe over many inputs): inputs and output names,
resume, bad files, local worker processes and Ray actors surviving a killed worker (each
killed process one the test started), and what fails every file alike (a bad model, an
unwritable output folder, a Ray address that does not answer) refused before the first file.

20 clips of 1-3 s cut from jfk.wav, plus silence, plus a corrupt WAV. The reference
is the sequential run (one in-process Transcriber); every other mode must write the
same bytes, each output once."""
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow.batch.inputs import expand_inputs, plan_jobs
from tallow.batch.local import run_local
from tallow.batch.worker import ModelError, Settings
from tallow.errors import Error

JFK = Path(__file__).parent / "data" / "jfk.wav"
N_CLIPS = 20


def write_wav(path, samples):
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def make_clips(folder):
    """20 WAV clips (jfk slices of 1-3 s; every fifth is silence) and one corrupt WAV."""
    with wave.open(str(JFK)) as f:
        assert f.getframerate() == 16000 and f.getnchannels() == 1
        jfk = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768
    rng = np.random.default_rng(0)
    (folder / "part2").mkdir(parents=True)
    clips = []
    for i in range(N_CLIPS):
        seconds = 1 + i % 3
        if i % 5 == 4:
            samples = np.zeros(16000 * seconds, np.float32)
        else:
            start = int(rng.integers(0, len(jfk) - 16000 * seconds))
            samples = jfk[start:start + 16000 * seconds]
        path = folder / ("part2" if i >= 10 else "") / f"clip{i:02d}.wav"
        write_wav(path, samples)
        clips.append(path)
    (folder / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00" + b"\xff" * 16)
    return clips


def outputs(folder):
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.txt"))}


def cli_env():
    package_parent = os.path.dirname(os.path.dirname(tallow.__file__))  # this tree's tallow
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    return env


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch") / "clips"
    make_clips(folder)
    return folder


@pytest.fixture(scope="module")
def reference(clips, tmp_path_factory, whisper_tiny_dir):
    """The sequential run: {relative output path: text}, and its outcomes (whisper_tiny_dir: the
    run loads the real tiny.en, so these tests carry the `models` marker)."""
    out = tmp_path_factory.mktemp("sequential")
    jobs = plan_jobs(expand_inputs([str(clips)]), str(out), "txt")
    outcomes = run_local(jobs, Settings(), workers=1)
    return outputs(out), outcomes


def test_sequential_run_writes_one_transcript_per_clip_and_reports_the_corrupt_file(reference):
    texts, outcomes = reference
    assert len(texts) == N_CLIPS and "corrupt.txt" not in texts
    assert sorted(o.status for o in outcomes) == ["done"] * N_CLIPS + ["failed"]
    failed = next(o for o in outcomes if o.status == "failed")
    assert failed.source.endswith("corrupt.wav") and "corrupt.wav" in failed.error
    assert "part2/clip10.txt" in texts  # the path below the folder it was found in
    # The same text as the model's own transcript of the clip.
    model = tallow.models.whisper.load("whisper-tiny.en", progress=False)
    assert texts["clip00.txt"] == model.transcribe(str(Path(failed.source).parent / "clip00.wav")).format("txt")
    assert any(t.strip() for t in texts.values())


def worker_pids(parent):
    """The multiprocessing spawn workers below process `parent`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"spawn_main" in cmd:
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker processes through /proc (Linux)")
def test_two_workers_survive_a_killed_worker_and_match_the_sequential_run(clips, reference, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "tallow", "transcribe", str(clips), "-d", str(out), "-j", "2"],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        pids = worker_pids(proc.pid)
        if killed is None and pids and out.is_dir() and any(out.rglob("*.txt")):
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)  # mid-file or between files: either way the pool breaks
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=120)
    assert killed is not None, stderr
    assert proc.returncode == 1, stderr  # 1: the corrupt file failed; the batch went on
    assert outputs(out) == reference[0]
    for i in range(N_CLIPS):  # each clip transcribed exactly once, the killed one included
        name = f"clip{i:02d}.wav"
        assert sum(1 for line in stderr.splitlines() if line.endswith(f": done {clips / ('part2' if i >= 10 else '') / name}")) == 1, stderr
    assert "failed: " in stderr and "corrupt.wav" in stderr
    assert f"{N_CLIPS + 1} files: {N_CLIPS} transcribed, 0 skipped (output exists), 1 failed" in stderr
    assert not list(out.rglob(".*.tmp"))  # no temporary file left behind

    # Resume: the rerun transcribes nothing that has its output, and retries the corrupt file only.
    again = subprocess.run([sys.executable, "-m", "tallow", "transcribe", str(clips), "-d", str(out)],
                           env=cli_env(), capture_output=True, text=True, timeout=120)
    assert f"0 transcribed, {N_CLIPS} skipped (output exists), 1 failed" in again.stderr, again.stderr
    assert outputs(out) == reference[0]


def test_inputs_globs_folders_and_manifests(tmp_path):
    for name in ("a/x.wav", "b/x.wav", "b/y.WAV", "b/notes.txt", "b/.hidden.wav"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "list.txt").write_text("# the archive\na/x.wav\n\n../outside.wav\n")
    (tmp_path.parent / "outside.wav").write_bytes(b"")
    found = expand_inputs([str(tmp_path / "b"), str(tmp_path / "*" / "y.WAV")], [str(tmp_path / "list.txt")])
    names = [name for _, name in found]
    assert names == ["a/x.wav", "../outside.wav", "x.wav", "y.WAV"]  # y.WAV once: folder and glob
    jobs = plan_jobs(found, str(tmp_path / "out"), "srt")
    assert [os.path.relpath(j.output, tmp_path / "out") for j in jobs] == ["a/x.srt", "outside.srt", "x.srt", "y.srt"]
    with pytest.raises(Error, match="would both write"):
        plan_jobs(expand_inputs([str(tmp_path / "a" / "x.wav"), str(tmp_path / "b" / "x.wav")]), "out", "txt")
    (tmp_path / "bad.txt").write_text("a/x.wav\nmissing.wav\n")
    with pytest.raises(Error, match="line 2: missing.wav: no such audio file"):
        expand_inputs([], [str(tmp_path / "bad.txt")])


# ---- Ray: a local cluster started by a child process --------------------------------------------
RAY_DRIVER = Path(__file__).parent / "ray_batch_driver.py"


def run_child(cmd, timeout, **kwargs):
    """(returncode, stdout, stderr) of cmd, run in its own session; past `timeout` (a hang guard)
    that session, which this test started, is killed and the test fails."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{cmd[:4]} did not end within {timeout} s: {stderr[-2000:]}")
    return proc.returncode, stdout, stderr


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the child checks an actor's ancestry through /proc (Linux)")
def test_ray_actor_pool_survives_a_killed_worker_and_ends_on_a_model_error(clips, reference, tmp_path):
    """tests/ray_batch_driver.py, in a child process: its own cluster, the CLI joining it by address,
    one of that cluster's actors killed mid-run; then actors without a model."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'tallow[ray]')")
    out = tmp_path / "out"
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model")
    returncode, stdout, stderr = run_child([sys.executable, str(RAY_DRIVER), str(clips), str(out), str(bad)],
                                           timeout=900, env=cli_env())
    assert returncode == 0, stderr[-4000:]
    result = json.loads(stdout.strip().splitlines()[-1])

    kill = result["kill"]
    assert kill["killed"] is not None and kill["restarts"] >= 1, kill
    assert kill["returncode"] == 1, kill["stderr"]  # 1: the corrupt file failed; the batch went on
    assert outputs(out) == reference[0]
    summary = re.search(r"(\d+) files: (\d+) transcribed, (\d+) skipped \(output exists\), (\d+) failed",
                        kill["stderr"])
    files, done, skipped, failed = map(int, summary.groups())
    # A job whose output was renamed into place just before the kill is skipped on retry, never rewritten.
    assert (files, done + skipped, failed) == (N_CLIPS + 1, N_CLIPS, 1) and skipped <= 1, kill["stderr"]
    assert "corrupt.wav" in kill["stderr"]
    assert not list(out.rglob(".*.tmp"))

    bad_model = result["bad_model"]
    assert bad_model["error"].startswith("cannot load the model: ") and str(bad) in bad_model["error"]
    # ended at the first result: no file reported or written, no actor restarted
    assert (bad_model["reported"], bad_model["written"], bad_model["restarts"]) == (0, [], 0), bad_model
    assert bad_model["actors"] == 2


# ---- what fails every file alike is one line and exit status 2, before the first file -----------
def tallow_cli(*args, timeout=120, prefix=(), **kwargs):
    return run_child([*prefix, sys.executable, "-m", "tallow", "transcribe", *map(str, args)], timeout,
                     env=cli_env(), **kwargs)


def error_line(stderr):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tallow transcribe: error: "), stderr
    return lines[0]


def test_a_bad_model_ends_the_batch_at_once(clips, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model")
    out = tmp_path / "out"
    modes = [["-j", "2"]] + ([["--ray"]] if importlib.util.find_spec("ray") else [])
    for mode in modes:  # checked in the driver: no worker, actor or cluster starts
        returncode, _, stderr = tallow_cli(clips, "-d", out, "--model", bad, *mode)
        assert returncode == 2 and f"cannot load the model: {bad}: expected a Whisper model" in error_line(stderr)
        assert not any(out.iterdir())


def test_worker_processes_that_cannot_load_the_model_end_the_batch(clips, tmp_path, monkeypatch):
    """The driver's check skipped (as if the model went bad after it): the first worker's ModelError
    ends the batch; no file is reported, where each used to fail after its worker "died" twice."""
    import tallow.batch.local as local

    monkeypatch.setattr(local, "check_model", lambda settings: None)  # the spawned workers still load
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model")
    reported = []
    jobs = plan_jobs(expand_inputs([str(clips)]), str(tmp_path / "out"), "txt")
    with pytest.raises(ModelError, match=f"cannot load the model: {re.escape(str(bad))}: expected a Whisper"):
        run_local(jobs, Settings(model=str(bad)), workers=2, on_outcome=reported.append)
    assert reported == [] and not list((tmp_path / "out").rglob("*"))


def test_an_unwritable_output_folder_is_refused_before_the_first_file(clips, tmp_path):
    """Checked before the model loads (the model here is junk: its error would come first otherwise)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    prefix = ()
    if os.geteuid() == 0:  # root writes anywhere: drop the capability that lets it
        if not shutil.which("setpriv"):
            pytest.skip("running as root and setpriv (util-linux) is missing to drop CAP_DAC_OVERRIDE")
        prefix = ("setpriv", "--bounding-set", "-dac_override", "--")
    try:
        returncode, _, stderr = tallow_cli(clips, "-d", folder, "--model", tmp_path / "junk", prefix=prefix)
    finally:
        folder.chmod(0o755)
    assert returncode == 2
    assert f"--output-dir {folder}: cannot write there (Permission denied)" in error_line(stderr)
    assert not any(folder.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_ray_address_where_nothing_listens_is_one_line_at_once(clips, tmp_path):
    """A port bound but not listening refuses connections: the probe says so before the model loads
    (the model is junk), where Ray retried for minutes."""
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        returncode, _, stderr = tallow_cli(clips, "-d", tmp_path / "out", "--model", tmp_path / "junk",
                                           "--ray", f"127.0.0.1:{port}")
    assert returncode == 2
    assert f"--ray 127.0.0.1:{port}: no Ray cluster at 127.0.0.1:{port} (Connection refused)" in error_line(stderr)


class SilentServer:
    """Accepts TCP connections on every interface (Ray dials the node's address, not 127.0.0.1)
    and never answers: a port where something listens that is not a Ray cluster."""

    def __init__(self):
        import threading
        self.sock = socket.socket()
        self.sock.bind(("", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_ray_cluster_that_does_not_answer_times_out_with_one_error(clips, tmp_path, silent_server,
                                                                   whisper_tiny_dir):
    returncode, _, stderr = tallow_cli(clips, "-d", tmp_path / "out", "--ray", f"127.0.0.1:{silent_server.port}",
                                       "--ray-timeout", "3")
    assert returncode == 2, stderr
    # Ray's own C++ client may log its connect warnings first; tallow's error is the last line.
    last = stderr.strip().splitlines()[-1]
    assert last == (f"tallow transcribe: error: --ray 127.0.0.1:{silent_server.port}: the Ray cluster did not "
                    "answer within 3 s; check the address (`ray status` on its head node), or wait longer "
                    "with --ray-timeout"), stderr
    assert "Traceback" not in stderr and not any((tmp_path / "out").iterdir())


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
@pytest.mark.parametrize("sig, returncode", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)])
def test_ray_connect_ends_on_sigterm_and_sigint(clips, tmp_path, silent_server, whisper_tiny_dir, sig, returncode):
    """While Ray waits for a cluster that does not answer (after the probe's connection, Ray's own
    arrives), the signal ends the driver, where it used to be ignored for minutes."""
    proc = subprocess.Popen([sys.executable, "-m", "tallow", "transcribe", str(clips), "-d", str(tmp_path / "out"),
                             "--ray", f"127.0.0.1:{silent_server.port}", "--ray-timeout", "300"],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # hang guards only
        while len(silent_server.accepted) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(silent_server.accepted) >= 2 and proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == returncode, stderr
    assert "Traceback" not in stderr


class _FakeRay:
    """Just enough of Ray for run_ray's scheduling: actors run their job when asked for it."""

    class exceptions:
        RayError = RuntimeError

    def __init__(self, cpus):
        self.cpus, self.actors = cpus, 0

    def cluster_resources(self):
        return {"CPU": float(self.cpus)}

    def remote(self, **options):
        fake = self

        def make(cls):
            class Handle:
                def __init__(self, settings):
                    fake.actors += 1
                    self.run = self

                def remote(self, source, output):
                    return ("done", source, output)
            return type("ActorClass", (), {"remote": staticmethod(Handle)})
        return make

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        from tallow.batch.worker import Outcome
        return Outcome(ref[1], ref[2], ref[0])

    def kill(self, actor):
        pass


def test_ray_workers_are_capped_at_the_clusters_cpus(monkeypatch, capsys):
    """An actor holds its CPU until the batch ends, so one more than the cluster can place never runs its files."""
    from tallow.batch import ray as batch_ray
    from tallow.batch.inputs import Job
    fake = _FakeRay(cpus=2)
    monkeypatch.setattr(batch_ray, "import_ray", lambda: type("R", (), {"is_initialized": staticmethod(lambda: True)}))
    monkeypatch.setattr(batch_ray, "check_model", lambda settings: None)
    monkeypatch.setattr(batch_ray, "connect", lambda address, timeout: fake)
    jobs = [Job(f"in/{i}.wav", f"out/{i}.txt") for i in range(6)]
    outcomes = batch_ray.run_ray(jobs, settings=None, workers=8)
    assert fake.actors == 2 and sorted(o.source for o in outcomes) == sorted(j.source for j in jobs)
    assert "has 2 CPUs: using 2 workers, not 8" in capsys.readouterr().err
