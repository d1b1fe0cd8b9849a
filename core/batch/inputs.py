"""The inputs of a batch transcription: files, globs, folders and manifest files
(one path per line) expanded into (input, output) jobs, one output per input.

An output is `OUTPUT_DIR/<name>.<format>`, where <name> is the input's path below
the folder or glob root it came from (so two `a.wav` in different folders do not
collide); a collision that remains is an error before anything runs."""
import glob
import os

from ..errors import Error

AUDIO_EXTENSIONS = (".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".aac", ".webm", ".mp4", ".mkv", ".wma", ".aiff")
GLOB_CHARS = "*?["


class Job:
    """One input file and the output file it gets."""

    def __init__(self, source, output):
        self.source, self.output = source, output

    def __repr__(self):
        return f"Job({self.source!r} -> {self.output!r})"


def expand_inputs(items, manifests=()):
    """[(path, name)]: each audio file once, with the relative name its output gets."""
    found = []
    for manifest in manifests:
        found.extend(_from_manifest(manifest))
    for item in items:
        if any(c in item for c in GLOB_CHARS) and not os.path.exists(item):
            matches = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not matches:
                raise Error(f"{item}: the pattern matches no file")
            root = _glob_root(item)
            found.extend((p, os.path.relpath(p, root)) for p in matches)
        elif os.path.isdir(item):
            files = _audio_files_below(item)
            if not files:
                raise Error(f"{item}: the folder holds no audio file ({', '.join(AUDIO_EXTENSIONS)})")
            found.extend((p, os.path.relpath(p, item)) for p in files)
        elif os.path.isfile(item):
            found.append((item, os.path.basename(item)))
        else:
            raise Error(f"{item}: no such audio file, folder or pattern")
    seen, unique = set(), []
    for path, name in found:  # one file named twice (a folder and a glob over it) runs once
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, name))
    return unique


def plan_jobs(inputs, output_dir, fmt):
    """Jobs with their output paths; an error when two inputs would write one output."""
    by_output = {}
    for path, name in inputs:
        name = os.path.normpath(name)
        if name.startswith(os.pardir) or os.path.isabs(name):  # never write outside output_dir
            name = os.path.basename(name)
        output = os.path.join(output_dir, os.path.splitext(name)[0] + "." + fmt)
        if output in by_output:
            raise Error(f"{path} and {by_output[output].source} would both write {output}; "
                        "give their folders as inputs (outputs keep the path below the folder) or rename one")
        by_output[output] = Job(path, output)
    return list(by_output.values())


def _from_manifest(manifest):
    """(path, name) for each non-empty, non-# line; relative paths are relative to the manifest."""
    try:
        with open(manifest, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as e:
        raise Error(f"{manifest}: cannot read the manifest: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise Error(f"{manifest}: the manifest is not UTF-8 text (one audio path per line)") from None
    base = os.path.dirname(os.path.abspath(manifest))
    out = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        path = line if os.path.isabs(line) else os.path.join(base, line)
        if not os.path.isfile(path):
            raise Error(f"{manifest} line {number}: {line}: no such audio file")
        out.append((path, line if not os.path.isabs(line) else os.path.basename(line)))
    return out


def _audio_files_below(folder):
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out.extend(os.path.join(root, f) for f in sorted(files)
                   if f.lower().endswith(AUDIO_EXTENSIONS) and not f.startswith("."))
    return out


def _glob_root(pattern):
    """The folder part of a pattern before its first wildcard: outputs keep the path below it."""
    parts = pattern.split(os.sep)
    for i, part in enumerate(parts):
        if any(c in part for c in GLOB_CHARS):
            return os.sep.join(parts[:i]) or "."
    return os.path.dirname(pattern) or "."


def wav_seconds(path):
    """The duration a WAV file's header gives, or None (not WAV, unreadable): the progress
    bar's total, known before any audio is decoded."""
    from ..audio.wav import open_wav
    try:
        with open(path, "rb") as fh:
            info, _, size = open_wav(fh, path)
        return size / (info.channels * info.bits // 8) / info.sample_rate
    except Exception:  # a bad file is reported by the worker that decodes it, not here
        return None
