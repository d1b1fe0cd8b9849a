"""`tallow transcribe` over many inputs: one output per input in --output-dir, a
progress bar and summary on stderr, resume (inputs whose output exists are
skipped), bad files reported and skipped. --workers N runs N processes here;
--ray [ADDRESS] runs a Ray actor pool on a cluster. Exit status 0 when every file
was transcribed or skipped, 1 when some failed (listed in the summary); 2 with one
line for what fails every file alike (an unwritable --output-dir, a model that does
not load, a cluster that does not answer), found before the first file runs."""
import os
import tempfile

from .args import positive_float, positive_int
from ..errors import Error


def add_batch_arguments(parser):
    parser.add_argument("--output-dir", "-d", default=None,
                        help="batch: write one transcript per input here (<name>.<format>, keeping the path "
                             "below a folder input); inputs whose transcript exists are skipped (resume)")
    parser.add_argument("--manifest", action="append", default=[], metavar="FILE",
                        help="batch: a text file with one audio path per line (relative to the file; # comments)")
    parser.add_argument("--workers", "-j", type=positive_int, default=None,
                        help="batch: worker processes, each loading the model once (default 1; "
                             "with --ray: one actor per CPU of the cluster)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="batch: run on a Ray cluster (pip install 'tallow[ray]'): ADDRESS is 'auto' (the "
                             "cluster started on this node with `ray start`), host:6379 or ray://host:10001; "
                             "without it, $RAY_ADDRESS or a new local cluster")
    parser.add_argument("--ray-timeout", type=positive_float, default=None, metavar="SECONDS",
                        help="batch: how long to wait for the --ray cluster to answer (default 30)")


def is_batch(args):
    many = len(args.audio) > 1 or any(os.path.isdir(a) or not os.path.exists(a) and any(c in a for c in "*?[")
                                      for a in args.audio)
    return bool(many or args.output_dir or args.manifest or args.workers or args.ray is not None)


def check_local_workers(workers):
    """Each local worker is a process holding its own copy of the model, and more of them
    than cores fight over the cores (core/batch/local.py: one per core is fastest): at most
    two per usable CPU. Unbounded, `-j 1000` on many files started 1000 model loads at once."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers > 2 * cpus:
        raise Error(f"--workers {workers}: this machine has {cpus} usable CPUs, and each worker process loads "
                    f"its own copy of the model and wants a core: use at most {2 * cpus} ({cpus} is fastest; "
                    "--ray spreads over a cluster)")


def run_batch(args, options):
    """options: the decoding options (transcribe.decoding_options) for every input."""
    from ..batch.inputs import expand_inputs, plan_jobs, wav_seconds
    from ..batch.progress import Progress
    from ..batch.worker import Settings

    if args.ray and os.path.exists(args.ray):  # `--ray a.wav b.wav`: the first input is not an address
        args.audio.insert(0, args.ray)
        args.ray = ""
    if args.output:
        raise Error("--output names one file; for many inputs give --output-dir")
    if not args.output_dir:
        raise Error("many inputs need --output-dir (one transcript file per input is written there)")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise Error(f"--output-dir {args.output_dir}: is a file, not a folder")
    if args.ray is None and args.workers:
        check_local_workers(args.workers)
    inputs = expand_inputs(args.audio, args.manifest)
    if not inputs:
        raise Error("no input: give audio files, globs, folders or --manifest FILE")
    jobs = plan_jobs(inputs, args.output_dir, args.format)
    check_output_dir(args.output_dir)
    settings = Settings(args.model, args.device, args.format, options, quantize=args.quantize)
    # Resume: a complete output exists (outputs are written atomically), so the job is done.
    todo = [job for job in jobs if not os.path.exists(job.output)]
    seconds = [wav_seconds(job.source) for job in todo]
    progress = Progress(len(jobs), None if None in seconds else sum(seconds))
    for job in jobs:
        if job not in todo:
            progress.skipped += 1
    if args.ray is not None:
        from ..batch.ray import CONNECT_TIMEOUT_S, run_ray
        run_ray(todo, settings, args.workers, args.ray or None, on_outcome=progress.add,
                timeout=args.ray_timeout or CONNECT_TIMEOUT_S)
    else:
        from ..batch.local import run_local
        run_local(todo, settings, args.workers or 1, on_outcome=progress.add)
    progress.summary()
    return 1 if progress.failed else 0


def check_output_dir(folder):
    """Create --output-dir and write (and remove) a probe file in it, before any model loads: a
    folder that cannot be written would otherwise fail every file after transcribing it."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tallow-probe-", suffix=".tmp", dir=folder)
    except OSError as e:
        raise Error(f"--output-dir {folder}: cannot write there ({e.strerror or e}); "
                    "choose a folder you can write to") from None
    os.close(fd)
    os.unlink(probe)
