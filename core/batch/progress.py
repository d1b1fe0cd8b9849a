"""Progress of a batch on stderr (files and audio hours) and its closing summary.

On a terminal the bar redraws in place; otherwise (a log file, CI) each finished
file is one line. Failures are printed as they happen, one line each."""
import sys
import time


class Progress:
    def __init__(self, total_files, total_seconds=None, out=None, width=24):
        self.total_files, self.total_seconds = total_files, total_seconds
        self.out = sys.stderr if out is None else out
        self.tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.width = width
        self.start = time.perf_counter()
        self.done = self.skipped = 0
        self.failed = []  # Outcomes
        self.audio_seconds = 0.0

    @property
    def finished(self):
        return self.done + self.skipped + len(self.failed)

    def add(self, outcome):
        if outcome.status == "done":
            self.done += 1
            self.audio_seconds += outcome.duration
        elif outcome.status == "skipped":
            self.skipped += 1
        else:
            self.failed.append(outcome)
            self._line(f"failed: {_failure(outcome)}")
        self._draw(outcome)

    def _draw(self, outcome):
        filled = int(self.width * self.finished / max(1, self.total_files))
        hours = f"{self.audio_seconds / 3600:.3f}"
        if self.total_seconds:
            hours += f"/{self.total_seconds / 3600:.3f}"
        bar = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.finished}/{self.total_files} files, "
               f"{hours} h audio, {time.perf_counter() - self.start:.0f} s")
        if self.tty:
            self.out.write("\r" + bar)
        else:
            self.out.write(f"{bar}: {outcome.status} {outcome.source}\n")
        self.out.flush()

    def _line(self, text):
        self.out.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.out.flush()

    def summary(self):
        """The closing lines: counts, audio hours, wall time, real-time factor, the failures."""
        wall = time.perf_counter() - self.start
        if self.tty:
            self.out.write("\n")
        rtf = f"{wall / self.audio_seconds:.3f}" if self.audio_seconds else "n/a"
        self.out.write(f"{self.total_files} files: {self.done} transcribed, {self.skipped} skipped (output exists), "
                       f"{len(self.failed)} failed; {self.audio_seconds / 3600:.3f} h of audio in {wall:.1f} s, "
                       f"real-time factor {rtf}\n")
        for outcome in self.failed:
            self.out.write(f"  failed: {_failure(outcome)}\n")
        self.out.flush()


def _failure(outcome):
    """The error, led by the file's path unless the message names it already."""
    return outcome.error if outcome.source in outcome.error else f"{outcome.source}: {outcome.error}"
