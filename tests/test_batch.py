"""Batch transcription (tallow transcribe over many inputs): inputs and output names,
resume, bad files, and local worker processes surviving a killed worker.

20 clips of 1-3 s cut from jfk.wav, plus silence, plus a corrupt WAV. The reference
is the sequential run (one in-process Transcriber); every other mode must write the
same bytes, each output once."""
import os
import signal
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
from tallow.batch.worker import Settings
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


# ---- Ray: a local cluster started by the test ------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tallow[ray]')")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = cli_env()["PYTHONPATH"]  # the workers import this tree's tallow
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def actor_pids():
    """The processes of the transcription actors (Ray titles them ray::_Actor...)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::_Actor"):
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the actor processes through /proc (Linux)")
def test_ray_actor_pool_survives_a_killed_worker_and_matches_the_sequential_run(ray_cluster, clips, reference,
                                                                               tmp_path):
    import threading

    from tallow.batch.ray import run_ray

    out = tmp_path / "out"
    jobs = plan_jobs(expand_inputs([str(clips)]), str(out), "txt")
    result = {}
    runner = threading.Thread(target=lambda: result.update(outcomes=run_ray(jobs, Settings(), workers=2)))
    runner.start()
    killed, deadline = None, time.monotonic() + 150
    while runner.is_alive() and time.monotonic() < deadline:
        if killed is None and out.is_dir() and any(out.rglob("*.txt")) and actor_pids():
            killed = actor_pids()[0]
            os.kill(killed, signal.SIGKILL)  # Ray restarts the actor and retries its job
        time.sleep(0.05)
    runner.join(timeout=60)
    assert killed is not None and "outcomes" in result
    outcomes = result["outcomes"]
    assert outputs(out) == reference[0]
    assert sorted(o.source for o in outcomes) == sorted(j.source for j in jobs)  # each job reported once
    done = [o for o in outcomes if o.status == "done"]
    skipped = [o for o in outcomes if o.status == "skipped"]
    # A job whose output was renamed into place just before the kill is skipped on retry, never rewritten.
    assert len(done) + len(skipped) == N_CLIPS and len(skipped) <= 1
    failed = [o for o in outcomes if o.status == "failed"]
    assert len(failed) == 1 and failed[0].source.endswith("corrupt.wav") and "corrupt.wav" in failed[0].error
    assert not list(out.rglob(".*.tmp"))
