"""One batch worker: loads the model once, then turns jobs into output files.

The same Transcriber runs in-process (one worker), in each local worker process
and in each Ray actor. A worker reads its input itself (only paths travel) and
writes its output atomically, so an output that exists is complete: a rerun, or
a retry after a worker was killed, skips it instead of writing it twice."""
import os
import time

from ..errors import Error
from ..io.atomic_output import atomic_output
from ..settings import tune_process


class Settings:
    """What every worker needs to build its model and format its outputs (picklable).
    options: model.transcribe's keywords; timestamps default as on the command line
    (on for srt/vtt, which need them; off otherwise). quantize: whisper.load's (None: float weights)."""

    def __init__(self, model="whisper-tiny.en", device=None, fmt="txt", options=None, quantize=None):
        self.model, self.device, self.fmt, self.quantize = model, device, fmt, quantize
        self.options = {"timestamps": fmt in ("srt", "vtt"), **(options or {})}


class Outcome:
    """What became of one job: status is "done", "skipped" (its output existed) or "failed"."""

    def __init__(self, source, output, status, duration=0.0, seconds=0.0, error=None):
        self.source, self.output, self.status = source, output, status
        self.duration, self.seconds, self.error = duration, seconds, error

    def __repr__(self):
        return (f"Outcome({self.source!r}, {self.status}, {self.duration:.1f} s"
                f"{', ' + self.error if self.error else ''})")


class ModelError(Error):
    """The model cannot be loaded, so no file can be transcribed: the batch ends with this line."""


def check_model(settings):
    """Load the model once in the driver, before any worker starts, and let it go: a bad name,
    file or device is then one error at once, not a crash per worker retried file after file
    (and a known model is fetched once, not by every worker at the same time)."""
    load_transcriber(settings)


def load_or_error(settings):
    """A worker's Transcriber, or the ModelError loading it raised (returned, not raised: a worker
    process's initializer or a Ray actor's constructor that fails reads as a crash and is retried).
    A worker process was started without the CLI's main(), so it tunes itself here (malloc policy;
    OPENBLAS_THREAD_TIMEOUT it inherits from the parent's environment)."""
    tune_process()
    try:
        return load_transcriber(settings)
    except ModelError as e:
        return e


def load_transcriber(settings):
    """A Transcriber; any failure to load the model is a one-line ModelError."""
    try:
        return Transcriber(settings)
    except Exception as e:  # a damaged file's KeyError or no memory also leaves nothing to run
        message = str(e) if isinstance(e, Error) else f"{settings.model}: {type(e).__name__}: {e}"
        raise ModelError(_one_line(f"cannot load the model: {message}")) from None


class Transcriber:
    def __init__(self, settings):
        from ..models import whisper
        self.settings = settings
        self.model = whisper.load(settings.model, device=settings.device, progress=False,
                                  quantize=getattr(settings, "quantize", None))

    def run(self, source, output):
        """Transcribe `source` into `output` unless that exists; a bad input is a "failed"
        Outcome naming the problem, never an exception that stops the batch."""
        if os.path.exists(output):
            return Outcome(source, output, "skipped")
        start = time.perf_counter()
        try:
            result = self.model.transcribe(source, **self.settings.options)
            text = result.format(self.settings.fmt)
            os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
            with atomic_output(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except Error as e:
            return Outcome(source, output, "failed", error=_one_line(str(e)))
        except Exception as e:
            # anything else one file provokes (a decoder's complaint, no memory) fails that file only
            return Outcome(source, output, "failed", error=_one_line(f"{type(e).__name__}: {e}"))
        return Outcome(source, output, "done", result.duration, time.perf_counter() - start)


def _one_line(message):
    return "; ".join(line.strip() for line in message.splitlines() if line.strip()) or "failed"
