"""Whisper's 30 s log-mel windows of a stream of 16 kHz sample chunks, computed one
window at a time, so the memory is one window of audio whatever its length.

A window at frame `seek` has the frames [seek, seek + 3000) that the log-mel of
the whole audio followed by 30 s of silence would have (the same samples under
each frame: the audio's start reflected, zeros past its end), except that the
floor at (max - 8) is taken over the window, as transformers' feature extractor
does per 30 s chunk, since the whole audio's maximum is not known yet.
"""
from array import array

from ..errors import Error
from .mel import HOP_LENGTH, N_FFT, N_FRAMES, SAMPLE_RATE, log_mel_frames
from .wav import numpy_or_none

_HALF = N_FFT // 2
_WINDOW_SAMPLES = (N_FRAMES - 1) * HOP_LENGTH + N_FFT  # the samples under one window's frames


class MelWindows:
    """windows = MelWindows(chunks); windows.has_frames(seek), windows.frames_from(seek),
    windows.window(seek) -> (n_mels, 3000) log-mel. Seeks must not go backwards."""

    def __init__(self, chunks, n_mels=80, filters=None, use_numpy=None):
        self._chunks = iter(chunks)
        self._np = numpy_or_none(use_numpy)
        self.n_mels, self.filters = n_mels, filters
        self._parts, self._base, self._have = [], 0, 0  # samples [base, have) in parts
        self._head = None  # the first 201 samples, for the reflection at the start
        self.total = None  # the number of samples, once the stream has ended

    def _fill(self, upto):
        """Read chunks until sample `upto` is in the buffer or the stream ends."""
        while self.total is None and self._have < upto:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.total = self._have
                break
            if hasattr(chunk, "numpy") and not hasattr(chunk, "__array_interface__"):
                chunk = chunk.numpy()  # a tallow or torch tensor
            chunk = self._np.asarray(chunk, self._np.float32).ravel() if self._np is not None else array("f", chunk)
            if len(chunk):
                self._parts.append(chunk)
                self._have += len(chunk)
            if self._head is None or len(self._head) <= _HALF:
                self._head = self._samples(0, min(self._have, _HALF + 1))

    def _samples(self, start, stop):
        """Samples [start, stop) of the audio (start >= base); zeros past its end."""
        buf = self._joined()
        lo, hi = start - self._base, min(stop, self._have) - self._base
        part = buf[lo:hi] if hi > lo else buf[:0]
        missing = stop - start - len(part)
        if self._np is not None:
            return self._np.concatenate([part, self._np.zeros(missing, self._np.float32)]) if missing else part
        return part + array("f", bytes(4 * missing)) if missing else part

    def _joined(self):
        if len(self._parts) != 1:
            empty = self._np.zeros(0, self._np.float32) if self._np is not None else array("f")
            joined = self._np.concatenate(self._parts) if self._np is not None and self._parts else empty
            if self._np is None:
                for part in self._parts:
                    joined.extend(part)
            self._parts = [joined]
        return self._parts[0]

    def has_frames(self, seek):
        """Whether the audio has a frame at `seek` (frames: whole 160-sample hops of audio)."""
        self._fill((seek + 1) * HOP_LENGTH)
        return self._have >= (seek + 1) * HOP_LENGTH

    def frames_from(self, seek):
        """Audio frames in the window at `seek`: N_FRAMES, or fewer for the last window."""
        self._fill((seek + N_FRAMES) * HOP_LENGTH)
        return max(0, min(N_FRAMES, self._have // HOP_LENGTH - seek))

    @property
    def duration(self):
        """Seconds of audio (whole frames, as the transcript's clock), or None while still streaming."""
        return None if self.total is None else self.total // HOP_LENGTH * HOP_LENGTH / SAMPLE_RATE

    def window(self, seek):
        """The (n_mels, 3000) log-mel at frame `seek`: float32 numpy, or a list of array('f') rows."""
        start = seek * HOP_LENGTH - _HALF
        if max(start, 0) < self._base:
            raise Error(f"MelWindows: window at frame {seek} is before the audio kept (seeks must not go backwards)")
        self._fill(start + _WINDOW_SAMPLES)
        self._drop(start)
        if start >= 0:
            x = self._samples(start, start + _WINDOW_SAMPLES)
        else:  # the first window: reflect the start, as log_mel_spectrogram pads
            head = self._head if self._head is not None else array("f")
            head = self._pad(head, _HALF + 1)
            reflected = head[_HALF:0:-1]
            body = self._samples(0, start + _WINDOW_SAMPLES)
            x = self._np.concatenate([reflected, body]) if self._np is not None else reflected + body
        return log_mel_frames(x, N_FRAMES, self.n_mels, self.filters, use_numpy=self._np is not None)

    def _pad(self, head, n):
        missing = n - len(head)
        if missing <= 0:
            return head
        if self._np is not None:
            return self._np.concatenate([self._np.asarray(head, self._np.float32),
                                         self._np.zeros(missing, self._np.float32)])
        return array("f", head) + array("f", bytes(4 * missing))

    def _drop(self, start):
        """Forget the samples before `start`: the next window starts at or after it."""
        if start > self._base:
            buf = self._joined()
            cut = min(start, self._have) - self._base
            self._parts = [buf[cut:]]
            self._base += cut
