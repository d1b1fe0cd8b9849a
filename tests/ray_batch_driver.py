"""The Ray half of test_batch.py, run by it as a child process, so that Ray ending its
driver's process fails that test instead of ending pytest.

It starts its own local Ray cluster, then
1. runs `tallow transcribe CLIPS -d OUT --ray ADDRESS -j 2` against it (the CLI joins it by
   address) and SIGKILLs one transcription actor mid-run: the actor is found by asking this
   cluster's actor table for its PID, and killed only if it descends from this process;
2. runs a batch whose actors cannot load the model (the driver's own check skipped), which
   must end at the first result with a ModelError, no actor restarted.

Usage: python ray_batch_driver.py CLIPS OUT BAD_MODEL. Prints one JSON object on stdout."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import ray
from ray._private import state as ray_state

import tallow.batch.ray as batch_ray
from tallow.batch.inputs import expand_inputs, plan_jobs
from tallow.batch.worker import ModelError, Settings


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def descends_from(pid, ancestor):
    """Whether `pid` is a process below `ancestor` (this driver started it)."""
    try:
        while pid > 1:
            pid = parent_of(pid)
            if pid == ancestor:
                return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def transcription_actors(state=None):
    """This cluster's transcription actors (its GCS actor table), as {actor id: info}."""
    return {actor_id: info for actor_id, info in ray_state.actors(actor_state_name=state).items()
            if info["ActorClassName"] == "_Actor"}


def run_and_kill_an_actor(clips, out, address):
    cmd = [sys.executable, "-m", "tallow", "transcribe", clips, "-d", out, "--ray", address, "-j", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed, deadline = None, time.monotonic() + 300  # a hang guard only
    while proc.poll() is None and time.monotonic() < deadline:
        if killed is None and os.path.isdir(out) and any(name.endswith(".txt") for _, _, names in os.walk(out)
                                                          for name in names):
            alive = [info["Pid"] for info in transcription_actors("ALIVE").values() if info["Pid"]]
            ours = [pid for pid in alive if descends_from(pid, os.getpid())]
            if ours:
                killed = ours[0]
                os.kill(killed, signal.SIGKILL)  # Ray restarts the actor and retries its job
        time.sleep(0.05)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    restarts = sum(info["NumRestarts"] for info in transcription_actors().values())
    return {"returncode": proc.returncode, "stderr": stderr, "killed": killed, "restarts": restarts}


def run_without_a_model(clips, bad_model):
    before = set(transcription_actors())
    batch_ray.check_model = lambda settings: None  # as if the model went bad after the driver's check
    out = tempfile.mkdtemp(prefix="tallow-ray-bad-model-")
    jobs = plan_jobs(expand_inputs([clips]), out, "txt")
    reported = []
    try:
        batch_ray.run_ray(jobs, Settings(model=bad_model), workers=2, on_outcome=reported.append)
        error = None
    except ModelError as e:
        error = str(e)
    actors = {k: v for k, v in transcription_actors().items() if k not in before}
    written = [name for _, _, names in os.walk(out) for name in names]
    return {"error": error, "reported": len(reported), "written": written, "actors": len(actors),
            "restarts": sum(info["NumRestarts"] for info in actors.values())}


def main(clips, out, bad_model):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = {"kill": run_and_kill_an_actor(clips, out, ray.get_runtime_context().gcs_address),
                  "bad_model": run_without_a_model(clips, bad_model)}
    finally:
        ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
