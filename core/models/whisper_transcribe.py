"""Long-form transcription, after openai-whisper's transcribe.py (MIT): 30 s log-mel
windows, each decoded with temperature fallback, cut into segments at timestamp
pairs, and the next window starting at the last timestamp (so no speech is cut
in half); the previous text is the next prompt.

The audio streams in: a file is decoded chunk by chunk and the log-mel computed
per window (tallow.audio.MelWindows), so memory stays bounded however long the
audio, and each segment reaches on_segment as soon as its window is decoded.
"""
import json

from ..audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, stream_audio
from ..audio.mel_windows import MelWindows
from ..audio.stream import check_samples
from ..creation import from_buffer
from ..errors import Error
from .whisper_decoding import DecodingOptions, check_search_width, decode, detect_language_from_features

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class Segment:
    def __init__(self, id, seek, start, end, text, tokens, result):
        self.id, self.seek, self.start, self.end = id, seek, start, end
        self.text, self.tokens = text, tokens
        self.temperature, self.avg_logprob = result.temperature, result.avg_logprob
        self.compression_ratio, self.no_speech_prob = result.compression_ratio, result.no_speech_prob

    def to_dict(self):
        keys = ("id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
                "compression_ratio", "no_speech_prob")
        return {k: getattr(self, k) for k in keys}

    def __repr__(self):
        return f"Segment({self.start:.2f}-{self.end:.2f}: {self.text!r})"


class TranscriptionResult:
    def __init__(self, text, segments, language, duration):
        self.text, self.segments, self.language, self.duration = text, segments, language, duration

    def __repr__(self):
        return f"TranscriptionResult(language={self.language!r}, {len(self.segments)} segments, text={self.text!r})"

    def to_dict(self):
        return {"text": self.text, "language": self.language, "duration": self.duration,
                "segments": [s.to_dict() for s in self.segments]}

    def to_txt(self):
        return "".join(s.text.strip() + "\n" for s in self.segments if s.text.strip())

    def to_srt(self):
        blocks, n = [], 0
        for s in self.segments:
            if s.text.strip():
                n += 1
                blocks.append(f"{n}\n{format_timestamp(s.start, True, ',')} --> "
                              f"{format_timestamp(s.end, True, ',')}\n{s.text.strip()}\n")
        return "\n".join(blocks)

    def to_vtt(self):
        lines = ["WEBVTT\n"]
        for s in self.segments:
            if s.text.strip():
                lines.append(f"{format_timestamp(s.start)} --> {format_timestamp(s.end)}\n{s.text.strip()}\n")
        return "\n".join(lines)

    def to_json(self):
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2) + "\n"

    def format(self, fmt):
        writers = {"txt": self.to_txt, "srt": self.to_srt, "vtt": self.to_vtt, "json": self.to_json}
        if fmt not in writers:
            raise Error(f"unknown transcript format {fmt!r} (known: {', '.join(writers)})")
        return writers[fmt]()


def format_timestamp(seconds, always_include_hours=False, decimal_marker="."):
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    head = f"{hours:02d}:" if always_include_hours or hours else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


# ---- audio -> mel windows ---------------------------------------------------------------------
def _chunks(audio):
    """The audio as an iterable of 16 kHz sample chunks: files stream, samples are one chunk."""
    if isinstance(audio, (str, bytes, bytearray, memoryview)) or hasattr(audio, "__fspath__"):
        return stream_audio(audio)
    if hasattr(audio, "numpy") and not hasattr(audio, "__array_interface__"):
        audio = audio.numpy()  # a tallow or torch tensor
    if hasattr(audio, "shape") and len(audio.shape) != 1:
        raise Error(f"whisper: audio samples must be 1-D (mono, 16 kHz), got shape {tuple(audio.shape)}")
    check_samples(audio, "whisper: audio samples")
    return [audio]


class _Mel:
    """30 s windows of the audio's log-mel as (1, n_mels, 3000) tensors, computed as
    the transcription reaches them. A window that runs past the audio has the
    log-mel of silence there, as transformers' feature extractor pads (openai-whisper
    pads the log-mel with zeros instead, a value no real audio has: with tiny.en that
    costs the comma in the jfk.wav reference transcript)."""

    def __init__(self, audio, n_mels, filters):
        self.mel = MelWindows(_chunks(audio), n_mels, filters)
        self.n_mels = n_mels

    def window(self, seek):
        """Frames [seek, seek + 3000) as a float32 tensor."""
        mel = self.mel.window(seek)
        if hasattr(mel, "shape"):
            import numpy as np
            data = memoryview(np.ascontiguousarray(mel, dtype="<f4")).cast("B")
        else:
            from array import array
            data = array("f")
            for row in mel:
                data.extend(row)
            data = data.tobytes()
        return from_buffer(data, "f32", (1, self.n_mels, N_FRAMES))


def detect_language(model, audio):
    """{language code: probability} for the first 30 s of audio."""
    mel = _Mel(audio, model.config.num_mel_bins, model.mel_filters)
    return detect_language_from_features(model, model.encode(mel.window(0)))[1]


# ---- the loop -----------------------------------------------------------------------------------
def _decode_with_fallback(model, features, temperatures, thresholds, options):
    compression_max, logprob_min, no_speech_max = thresholds
    result = None
    for t in temperatures:
        kw = dict(options)
        if t > 0:
            kw.pop("beam_size", None)
            kw.pop("patience", None)
        else:
            kw.pop("best_of", None)
        result = decode(model, features, DecodingOptions(temperature=t, **kw))
        needs_fallback = (compression_max is not None and result.compression_ratio > compression_max) or \
                         (logprob_min is not None and result.avg_logprob < logprob_min)
        if no_speech_max is not None and result.no_speech_prob > no_speech_max and \
                logprob_min is not None and result.avg_logprob < logprob_min:
            needs_fallback = False  # silence: nothing better to find
        if not needs_fallback:
            break
    return result


def transcribe(model, audio, language=None, task="transcribe", beam_size=None, best_of=None, patience=None,
               length_penalty=None, temperature=DEFAULT_TEMPERATURES, compression_ratio_threshold=2.4,
               logprob_threshold=-1.0, no_speech_threshold=0.6, condition_on_previous_text=True,
               initial_prompt=None, timestamps=True, suppress_tokens="-1", suppress_blank=True,
               max_initial_timestamp=1.0, seed=0, on_segment=None, on_window=None):
    """Transcribe (or translate to English) audio of any length.

    audio: a path or file bytes (WAV; other formats through ffmpeg), or mono float
    samples at 16 kHz (list, array, numpy array, tensor). language: a code such as
    "en" ("en" for English-only models; detected from the first 30 s when None).
    beam_size: beam search at temperature 0 (None: greedy). temperature: one value
    or the fallback sequence tried while the text is too repetitive
    (compression_ratio_threshold) or too improbable (logprob_threshold).
    timestamps=False decodes without timestamp tokens (one segment per window).
    on_segment: called with each Segment as soon as it is final.
    on_window: called after each window with the seconds of audio done so far (progress
    for a caller that shows it; silent windows count too).
    Returns a TranscriptionResult: .text, .segments (.start, .end, .text), .language.
    """
    tok = model.tokens
    check_search_width(beam_size, best_of, patience)  # before any audio is read
    mel = _Mel(audio, model.config.num_mel_bins, model.mel_filters)
    if not model.is_multilingual:
        if language not in (None, "en", "english", "English"):
            raise Error(f"{model.name} is an English-only model; language {language!r} is not available")
        if task == "translate":
            raise Error(f"{model.name} is an English-only model; it cannot translate")
        language = "en"
    elif language is None:
        first = model.encode(mel.window(0))
        language = detect_language_from_features(model, first)[0]
    elif language not in tok.languages:
        tok.language_token(language)  # raises, listing the codes
    temperatures = [temperature] if isinstance(temperature, (int, float)) else list(temperature)
    options = dict(task=task, language=language, beam_size=beam_size, best_of=best_of, patience=patience,
                   length_penalty=length_penalty, suppress_tokens=suppress_tokens, suppress_blank=suppress_blank,
                   without_timestamps=not timestamps, max_initial_timestamp=max_initial_timestamp, seed=seed)
    thresholds = (compression_ratio_threshold, logprob_threshold, no_speech_threshold)

    input_stride = N_FRAMES // model.config.max_source_positions  # mel frames per audio position: 2
    precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step: 0.02
    all_tokens, segments = [], []
    prompt_reset_since = 0
    if initial_prompt:
        all_tokens.extend(tok.tokenizer.encode(" " + initial_prompt.strip(), add_special_tokens=False))
    n_initial = len(all_tokens)
    seek = 0
    while mel.mel.has_frames(seek):
        window_seek = seek
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        size = mel.mel.frames_from(seek)
        window_seconds = size * HOP_LENGTH / SAMPLE_RATE
        features = model.encode(mel.window(seek))
        options["prompt"] = all_tokens[prompt_reset_since:]
        result = _decode_with_fallback(model, features, temperatures, thresholds, options)
        tokens = result.tokens

        if no_speech_threshold is not None and result.no_speech_prob > no_speech_threshold and \
                not (logprob_threshold is not None and result.avg_logprob > logprob_threshold):
            seek += size  # silence
            if on_window is not None:
                on_window(seek * HOP_LENGTH / SAMPLE_RATE)
            continue

        new = []  # (start, end, tokens)
        is_ts = [t >= tok.timestamp_begin for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
        if cuts:
            if single_ending:
                cuts.append(len(tokens))
            last = 0
            for cut in cuts:
                part = tokens[last:cut]
                new.append((time_offset + (part[0] - tok.timestamp_begin) * precision,
                            time_offset + (part[-1] - tok.timestamp_begin) * precision, part))
                last = cut
            if single_ending:
                seek += size
            else:  # resume at the last closed timestamp
                seek += (tokens[last - 1] - tok.timestamp_begin) * input_stride
        else:
            end = window_seconds
            stamps = [t for t in tokens if t >= tok.timestamp_begin]
            if stamps and stamps[-1] != tok.timestamp_begin:
                end = (stamps[-1] - tok.timestamp_begin) * precision
            new.append((time_offset, time_offset + end, tokens))
            seek += size

        for start, end, part in new:
            text = tok.decode_text(part)
            if start == end or not text.strip():
                text, part = "", []
            if mel.mel.duration is not None:  # the last timestamp may overshoot the padded audio
                end = min(end, mel.mel.duration)
            end = max(start, end)
            seg = Segment(len(segments), window_seek, start, end, text, part, result)
            segments.append(seg)
            all_tokens.extend(part)
            if on_segment is not None and text:
                on_segment(seg)
        if not condition_on_previous_text or result.temperature > 0.5:
            prompt_reset_since = len(all_tokens)
        if on_window is not None:
            on_window(seek * HOP_LENGTH / SAMPLE_RATE)

    text = tok.decode_text(all_tokens[n_initial:])
    return TranscriptionResult(text, segments, language, mel.mel.duration or 0.0)
