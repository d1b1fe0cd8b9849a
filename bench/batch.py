"""Batch transcription throughput: files per minute and audio hours per hour for tallow
with 1 and 2 local worker processes, 1 and 2 Ray actors on a local Ray cluster, and
faster-whisper's BatchedInferencePipeline (CTranslate2, the same tiny.en weights),
all on the same clips in the same run.

    python bench/batch.py [--clips 20] [--threads 2] [--no-ray]

The clips are 1-3 s slices of jfk.wav (every fifth padded with silence), written to a
temporary folder. Each tallow figure is wall time from the start of the batch (worker
start and model loads included) to the last output written; outputs are compared with
the one-worker run. BLAS threads per worker are --threads divided by the workers.
"""
import argparse
import os
import sys
import tempfile
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JFK = ROOT / "tests" / "data" / "jfk.wav"


def make_clips(folder, n):
    import numpy as np
    with wave.open(str(JFK)) as f:
        jfk = np.frombuffer(f.readframes(f.getnframes()), "<i2")
    rng = np.random.default_rng(0)
    total = 0.0
    for i in range(n):
        seconds = 1 + i % 3
        start = int(rng.integers(0, len(jfk) - 16000 * seconds))
        samples = jfk[start:start + 16000 * seconds]
        if i % 5 == 4:
            samples = np.concatenate([samples[:8000], np.zeros(16000 * seconds - 8000, "<i2")])
        with wave.open(str(folder / f"clip{i:02d}.wav"), "wb") as f:
            f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000)
            f.writeframes(samples.astype("<i2").tobytes())
        total += seconds
    return sorted(folder.glob("*.wav")), total


def rates(name, seconds, files, audio_seconds, extra=""):
    print(f"{name:34s} {seconds:7.1f} s  {files / seconds * 60:7.1f} files/min  "
          f"{audio_seconds / seconds:6.2f} audio-h/h{extra}")


def bench_tallow(clips, audio_seconds, folder, workers, threads, ray=False):
    from tallow.batch.inputs import expand_inputs, plan_jobs
    from tallow.batch.worker import Settings

    out = folder / f"out-{'ray' if ray else 'local'}-{workers}"
    jobs = plan_jobs(expand_inputs([str(c) for c in clips]), str(out), "txt")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(max(1, threads // workers))  # inherited by the workers started below
    start = time.perf_counter()
    if ray:
        from tallow.batch.ray import run_ray
        outcomes = run_ray(jobs, Settings(), workers=workers)
    else:
        from tallow.batch.local import run_local
        outcomes = run_local(jobs, Settings(), workers=workers) if workers > 1 else _in_subprocess(jobs)
    seconds = time.perf_counter() - start
    failed = [o for o in outcomes if o.status != "done"]
    if failed:
        raise SystemExit(f"{len(failed)} files did not transcribe: {failed[:3]}")
    rates(f"tallow {'Ray actors' if ray else 'local workers'} x{workers}", seconds, len(jobs), audio_seconds)
    return {Path(j.output).name: Path(j.output).read_text() for j in jobs}


def _in_subprocess(jobs):
    """One worker in a fresh process too, so its BLAS threads follow the setting like the others'."""
    from tallow.batch.local import _run_pool
    from tallow.batch.worker import Settings
    outcomes = []
    _run_pool(jobs, Settings(), 1, outcomes.append, {})
    return outcomes


def bench_faster_whisper(clips, audio_seconds, threads, batch_size):
    try:
        from faster_whisper import BatchedInferencePipeline, WhisperModel
    except ImportError:
        print("faster-whisper: skipped: not installed (pip install faster-whisper)")
        return None
    import tallow
    start = time.perf_counter()
    model = WhisperModel(str(tallow.hub.fetch("whisper-tiny.en-ct2")), device="cpu", compute_type="float32",
                         cpu_threads=threads)
    pipeline = BatchedInferencePipeline(model)
    texts = {}
    for clip in clips:
        segments, _ = pipeline.transcribe(str(clip), batch_size=batch_size, language="en", beam_size=1)
        texts[clip.stem + ".txt"] = "".join(s.text.strip() + "\n" for s in segments if s.text.strip())
    rates(f"faster-whisper batched (bs {batch_size})", time.perf_counter() - start, len(clips), audio_seconds)
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads in all (default 2)")
    ap.add_argument("--batch-size", type=int, default=8, help="faster-whisper's batch size")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "clips").mkdir()
        clips, audio_seconds = make_clips(folder / "clips", args.clips)
        print(f"{len(clips)} clips, {audio_seconds:.0f} s of audio, Whisper tiny.en greedy, {args.threads} threads")
        reference = bench_tallow(clips, audio_seconds, folder, 1, args.threads)
        same = [bench_tallow(clips, audio_seconds, folder, 2, args.threads) == reference]
        if not args.no_ray:
            try:
                import ray
            except ImportError:
                print("Ray: skipped: not installed (pip install 'tallow[ray]')")
            else:
                import tallow  # the workers import the same tallow as this driver
                package_parent = os.path.dirname(os.path.dirname(tallow.__file__))
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))
                ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
                same += [bench_tallow(clips, audio_seconds, folder, w, args.threads, ray=True) == reference
                         for w in (1, 2)]
                ray.shutdown()
        fw = bench_faster_whisper(clips, audio_seconds, args.threads, args.batch_size)
        print(f"tallow outputs identical across modes: {all(same)}")
        if fw is not None:
            agree = sum(fw[k].strip().lower() == reference[k].strip().lower() for k in reference)
            print(f"faster-whisper's text equals tallow's on {agree}/{len(reference)} clips (case-insensitive)")


if __name__ == "__main__":
    main()
