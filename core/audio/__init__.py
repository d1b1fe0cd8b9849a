"""Audio for speech models: load and resample to 16 kHz, Whisper's log-mel spectrogram.

    samples = tallow.audio.load_audio("speech.wav")        # array('f'), mono, 16 kHz
    for chunk in tallow.audio.stream_audio("long.mp3"):    # the same in chunks, bounded memory
    mel = tallow.audio.log_mel_spectrogram(tallow.audio.pad_or_trim(samples))  # (80, 3000)
"""
from .filters import MelFilterBank, compute_mel_filters, mel_filters
from .load import load_audio
from .mel import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from .resample import Resampler, resample
from .stream import stream_audio
from .wav import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, decode_wav

__all__ = [
    "load_audio", "stream_audio", "Resampler", "MIN_SAMPLE_RATE", "MAX_SAMPLE_RATE", "log_mel_spectrogram",
    "pad_or_trim", "resample", "mel_filters", "compute_mel_filters",
    "MelFilterBank", "decode_wav", "SAMPLE_RATE", "N_FFT", "HOP_LENGTH", "CHUNK_LENGTH",
    "N_SAMPLES", "N_FRAMES",
]
