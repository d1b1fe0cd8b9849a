"""tallow.audio: WAV decoding, resampling, Whisper's log-mel spectrogram.

References: Python's `wave` module and hand-written headers for the files,
scipy.io.wavfile for decoding, scipy.signal.resample_poly for resampling, and
openai-whisper's log_mel_spectrogram (transcribed below, run on torch) for the
spectrogram. Each check runs on the numpy path and the pure-Python path.
"""
import importlib
import io
import shutil
import struct
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

import tallow.audio as A
from tallow.errors import Error, FormatError

DATA = Path(__file__).parent / "data"
JFK = DATA / "jfk.wav"
PATHS = [pytest.param(True, id="numpy"), pytest.param(False, id="python")]


# ---- building WAV files ------------------------------------------------------
def _chunk(cid, body):
    return cid + struct.pack("<I", len(body)) + body + (b"\0" if len(body) % 2 else b"")


def _fmt(code, channels, rate, bits, extensible=False):
    block = channels * bits // 8
    base = struct.pack("<HHIIHH", 0xFFFE if extensible else code, channels, rate, (rate * block) & 0xFFFFFFFF,
                       block, bits)
    if extensible:
        guid = struct.pack("<H", code) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        base += struct.pack("<HHI", 22, bits, 0) + guid
    return base


def make_wav(data_bytes, code=1, channels=1, rate=16000, bits=16, extensible=False, chunks_before=(), fmt_last=False):
    fmt = _chunk(b"fmt ", _fmt(code, channels, rate, bits, extensible))
    data = _chunk(b"data", data_bytes)
    extra = b"".join(_chunk(cid, body) for cid, body in chunks_before)
    body = b"WAVE" + extra + (data + fmt if fmt_last else fmt + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _signal(n=1000, channels=1, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.99, 0.99, size=(n, channels))


def _pcm_with_wave_module(x, bits):
    """Integer PCM through Python's own `wave` writer; returns (bytes, exact floats)."""
    if bits == 8:
        ints = np.round(x * 127).astype(np.int64) + 128
        raw = ints.astype(np.uint8).tobytes()
        expected = (ints - 128) / 128.0
    else:
        scale = 2 ** (bits - 1)
        ints = np.round(x * (scale - 1)).astype(np.int64)
        raw = b"".join(int(v).to_bytes(bits // 8, "little", signed=True) for v in ints.ravel())
        expected = ints / scale
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(x.shape[1])
        w.setsampwidth(bits // 8)
        w.setframerate(16000)
        w.writeframes(raw)
    return buf.getvalue(), expected.mean(axis=1)


# ---- decoding ----------------------------------------------------------------
@pytest.mark.parametrize("use_numpy", PATHS)
@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_pcm_formats_decode_and_mix_down(bits, channels, use_numpy):
    x = _signal(777, channels, seed=bits)
    blob, expected = _pcm_with_wave_module(x, bits)
    samples, info = A.decode_wav(blob, "t.wav", use_numpy=use_numpy)
    assert (info.bits, info.channels, info.sample_rate) == (bits, channels, 16000)
    np.testing.assert_allclose(np.asarray(samples, np.float64), expected, atol=1e-6, rtol=0)
    # scipy's reader (another implementation) agrees on the integer values
    wavfile = pytest.importorskip("scipy.io.wavfile")
    _, ref = wavfile.read(io.BytesIO(blob))
    ref = ref.reshape(len(x), channels).astype(np.float64)
    # scipy returns 24-bit samples left-justified in int32
    ref = (ref - 128) / 128 if bits == 8 else ref / 2.0 ** (31 if bits == 24 else bits - 1)
    np.testing.assert_allclose(ref.mean(axis=1), expected, atol=1e-6)


@pytest.mark.parametrize("use_numpy", PATHS)
@pytest.mark.parametrize("bits,np_type", [(32, "<f4"), (64, "<f8")])
@pytest.mark.parametrize("extensible", [False, True])
def test_float_and_extensible_formats(bits, np_type, extensible, use_numpy):
    x = _signal(500, 2, seed=3).astype(np_type)
    blob = make_wav(x.tobytes(), code=3, channels=2, rate=16000, bits=bits, extensible=extensible)
    samples, info = A.decode_wav(blob, "f.wav", use_numpy=use_numpy)
    assert info.bits == bits and info.channels == 2
    np.testing.assert_allclose(np.asarray(samples), x.astype(np.float64).mean(axis=1), atol=1e-6)
    wavfile = pytest.importorskip("scipy.io.wavfile")
    _, ref = wavfile.read(io.BytesIO(blob))
    np.testing.assert_allclose(np.asarray(samples), ref.astype(np.float64).mean(axis=1), atol=1e-6)


@pytest.mark.parametrize("use_numpy", PATHS)
def test_extensible_24bit_pcm(use_numpy):
    x = _signal(300, 1, seed=9)[:, 0]
    ints = np.round(x * (2**23 - 1)).astype(np.int64)
    raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
    blob = make_wav(raw, code=1, bits=24, extensible=True)
    samples, _ = A.decode_wav(blob, "e.wav", use_numpy=use_numpy)
    np.testing.assert_allclose(np.asarray(samples), ints / 2**23, atol=1e-7)


@pytest.mark.parametrize("use_numpy", PATHS)
def test_chunk_order_and_odd_sized_chunks(use_numpy):
    ints = np.arange(-50, 51, dtype="<i2") * 300
    blob = make_wav(ints.tobytes(), chunks_before=[(b"LIST", b"odd"), (b"junk", b"12345")], fmt_last=True)
    samples, _ = A.decode_wav(blob, "o.wav", use_numpy=use_numpy)
    np.testing.assert_allclose(np.asarray(samples), ints / 32768.0, atol=1e-7)
    # Python's `wave` module (which needs fmt first) reads the odd chunks the same way
    fmt_first = make_wav(ints.tobytes(), chunks_before=[(b"LIST", b"odd"), (b"junk", b"12345")])
    with wave.open(io.BytesIO(fmt_first)) as w:
        assert np.array_equal(np.frombuffer(w.readframes(w.getnframes()), "<i2"), ints)
    assert np.array_equal(A.decode_wav(fmt_first, use_numpy=use_numpy)[0], samples)


def _bad_files():
    good = make_wav(np.zeros(10, "<i2").tobytes())
    truncated = good[:-6]
    return [
        ("not-riff.wav", b"ID3\x03" + bytes(40), "not a RIFF/WAVE"),
        ("truncated.wav", truncated, "truncated data chunk"),
        ("mulaw.wav", make_wav(bytes(10), code=7, bits=8), "unsupported WAV format code 0x0007 (mu-law)"),
        ("pcm12.wav", make_wav(bytes(12), bits=12), "unsupported bit depth 12"),
        ("float16.wav", make_wav(bytes(12), code=3, bits=16), "unsupported bit depth 16"),
        ("nofmt.wav", b"RIFF" + struct.pack("<I", 16) + b"WAVE" + _chunk(b"data", bytes(4)), "no 'fmt ' chunk"),
        ("nodata.wav", b"RIFF" + struct.pack("<I", 28) + b"WAVE" + _chunk(b"fmt ", _fmt(1, 1, 16000, 16)),
         "no 'data' chunk"),
        ("halfframe.wav", make_wav(bytes(5), channels=1, bits=16), "not a whole number of 2-byte frames"),
    ]


@pytest.mark.parametrize("name,blob,message", _bad_files(), ids=[b[0] for b in _bad_files()])
def test_bad_wav_files_raise_format_error_naming_file(tmp_path, name, blob, message, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _: None)  # no ffmpeg: non-WAV input must say so
    path = tmp_path / name
    path.write_bytes(blob)
    with pytest.raises(FormatError) as e:
        A.load_audio(path)
    assert name in str(e.value)
    assert message in str(e.value) or (name == "not-riff.wav" and "install ffmpeg" in str(e.value))


def test_missing_file_is_format_error(tmp_path):
    with pytest.raises(FormatError, match="nope.wav"):
        A.load_audio(tmp_path / "nope.wav")


def test_non_wav_without_ffmpeg_says_install_or_convert(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _: None)
    with pytest.raises(FormatError, match="install ffmpeg.*or convert the audio to WAV"):
        A.load_audio(b"fLaC" + bytes(100))


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed on this machine")
def test_flac_through_ffmpeg_matches_wav(tmp_path):
    flac = tmp_path / "jfk.flac"
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(JFK), str(flac)], check=True)
    np.testing.assert_allclose(np.asarray(A.load_audio(flac)), np.asarray(A.load_audio(JFK)), atol=1.5 / 32768)


# ---- resampling ----------------------------------------------------------------
@pytest.mark.parametrize("use_numpy", PATHS)
@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
def test_resample_matches_scipy_resample_poly(rate, use_numpy):
    signal = pytest.importorskip("scipy.signal")
    from math import gcd

    x = _signal(3000 if use_numpy is False else 20000, seed=rate)[:, 0].astype(np.float32)
    g = gcd(rate, 16000)
    ref = signal.resample_poly(x.astype(np.float64), 16000 // g, rate // g)
    y = np.asarray(A.resample(x, rate, 16000, use_numpy=use_numpy), np.float64)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, atol=1e-6, rtol=0)  # float32 output rounding


def test_resample_is_band_limited():
    """44.1 kHz -> 16 kHz keeps tones below 7 kHz and removes those above the new 8 kHz Nyquist."""
    t = np.arange(44100) / 44100

    def level(freq):
        y = np.asarray(A.resample(np.sin(2 * np.pi * freq * t), 44100, 16000))[2000:-2000]
        return np.sqrt(np.mean(y**2)) / np.sqrt(0.5)

    assert abs(level(1000) - 1) < 0.005 and abs(level(6000) - 1) < 0.005  # passband
    assert level(7000) > 0.95  # the Kaiser filter's transition starts near 7 kHz
    assert level(10000) < 3e-3 and level(12000) < 1e-3  # stopband: 50 dB down and more


def test_load_audio_resamples_and_returns_float32_array(tmp_path):
    x = _signal(44100, 2, seed=1)
    ints = np.round(x * 32767).astype("<i2")
    path = tmp_path / "stereo44k.wav"
    path.write_bytes(make_wav(ints.tobytes(), channels=2, rate=44100))
    out = A.load_audio(path)
    assert out.typecode == "f" and len(out) == 16000
    signal = pytest.importorskip("scipy.signal")
    ref = signal.resample_poly((ints / 32768.0).mean(axis=1), 160, 441)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-6)
    assert A.load_audio(path.read_bytes(), use_numpy=False) == A.load_audio(path, use_numpy=False)


def test_load_audio_jfk():
    samples = A.load_audio(JFK)
    assert len(samples) == 176000  # 11 s at 16 kHz
    with wave.open(str(JFK)) as w:
        ref = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32768.0
    np.testing.assert_array_equal(np.asarray(samples), ref.astype(np.float32))


# ---- log-mel spectrogram ---------------------------------------------------------
@pytest.fixture(scope="module")
def mel_npz():
    from tallow import hub

    return hub.fetch("whisper-assets", progress=False) / "mel_filters.npz"


def whisper_log_mel_reference(audio, filters, padding=0):
    """openai-whisper 20250625, whisper/audio.py, log_mel_spectrogram (MIT licence,
    Copyright (c) 2022 OpenAI): its lines, run on torch; `filters` is the
    mel_filters.npz array it would load."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    N_FFT, HOP_LENGTH = 400, 160
    audio = torch.from_numpy(np.asarray(audio, np.float32))
    if padding > 0:
        audio = F.pad(audio, (0, padding))
    window = torch.hann_window(N_FFT).to(audio.device)
    stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2

    filters = torch.from_numpy(filters)
    mel_spec = filters @ magnitudes

    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    log_spec = (log_spec + 4.0) / 4.0
    return log_spec.numpy()


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_from_npz_and_formula_match_numpy(mel_npz, n_mels):
    ref = np.load(mel_npz)[f"mel_{n_mels}"]
    assert np.array_equal(A.mel_filters(n_mels, mel_npz).numpy(), ref)
    np.testing.assert_allclose(A.mel_filters(n_mels).numpy(), ref, atol=1e-8, rtol=1e-6)


def test_mel_filters_from_wrong_file(tmp_path):
    np.savez(tmp_path / "m.npz", mel_80=np.zeros((80, 100), np.float32))
    with pytest.raises(FormatError, match="m.npz.*mel_128"):
        A.mel_filters(128, tmp_path / "m.npz")
    with pytest.raises(FormatError, match=r"m.npz: mel_80 is f32\[80, 100\], expected f32\[80, 201\]"):
        A.mel_filters(80, tmp_path / "m.npz")


@pytest.mark.parametrize("n_mels,padding", [(80, 0), (80, A.N_SAMPLES), (128, 0)])
def test_log_mel_matches_whisper_numpy_path(mel_npz, n_mels, padding):
    samples = np.frombuffer(A.load_audio(JFK), np.float32)
    ref = whisper_log_mel_reference(samples, np.load(mel_npz)[f"mel_{n_mels}"], padding)
    got = A.log_mel_spectrogram(samples, n_mels=n_mels, padding=padding, use_numpy=True)
    assert got.shape == ref.shape == (n_mels, (len(samples) + padding) // 160)
    assert np.abs(got - ref).max() < 1e-4
    from_file = A.log_mel_spectrogram(samples, n_mels=n_mels, padding=padding, filters=mel_npz)
    assert np.abs(from_file - ref).max() < 1e-4


def test_log_mel_matches_whisper_pure_python_path(mel_npz):
    samples = A.load_audio(JFK)  # 11 s: about 0.7 s in pure Python
    ref = whisper_log_mel_reference(np.frombuffer(samples, np.float32), np.load(mel_npz)["mel_80"])
    got = A.log_mel_spectrogram(samples, use_numpy=False)
    assert isinstance(got, list) and len(got) == 80 and all(r.typecode == "f" for r in got)
    assert np.abs(np.array([list(r) for r in got]) - ref).max() < 1e-4


@pytest.mark.parametrize("n", [40, 400, 1000])
def test_pure_python_rfft_power_matches_numpy(n):
    from tallow.audio.fft import fft, rfft_power

    x = _signal(n, seed=n)[:, 0]
    np.testing.assert_allclose(rfft_power(list(x)), np.abs(np.fft.rfft(x)) ** 2, rtol=1e-9, atol=1e-9)
    z = x + 1j * _signal(n, seed=n + 1)[:, 0]
    np.testing.assert_allclose(fft(list(z)), np.fft.fft(z), atol=1e-9)


def test_log_mel_rejects_too_short_input():
    with pytest.raises(Error, match="more than 200 samples"):
        A.log_mel_spectrogram([0.0] * 100)
    with pytest.raises(Error, match="80 or 128"):
        A.log_mel_spectrogram([0.0] * 1000, n_mels=64)


def test_pad_or_trim():
    a = A.pad_or_trim([0.5] * 10, 16)
    assert a.typecode == "f" and list(a) == [0.5] * 10 + [0.0] * 6
    assert list(A.pad_or_trim(a, 4)) == [0.5] * 4
    n = A.pad_or_trim(np.ones(5, np.float32), 8)
    assert isinstance(n, np.ndarray) and n.tolist() == [1] * 5 + [0] * 3
    assert len(A.pad_or_trim(np.ones(A.N_SAMPLES + 7))) == A.N_SAMPLES


# ---- hostile and long input: bounded work, streaming, NaN ------------------------------
def _tone_wav(path, rate, seconds, channels=1, freqs=(440.0, 1234.0, 2900.0)):
    """A band-limited 16-bit PCM WAV through Python's `wave` module; returns the exact floats."""
    t = np.arange(int(rate * seconds)) / rate
    x = sum(np.sin(2 * np.pi * f * t) for f in freqs) / (len(freqs) + 0.5)
    ints = np.round(np.repeat(x[:, None], channels, axis=1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(ints.tobytes())
    return ints[:, 0] / 32768.0


@pytest.mark.parametrize("rate", [0, 999, 768001, 999_999_937, 2**31, 2**32 - 1])
def test_absurd_wav_sample_rates_are_rejected_at_once(tmp_path, rate, monkeypatch):
    R = importlib.import_module("tallow.audio.resample")  # the module; tallow.audio.resample is also a function
    built = []  # was: minutes and gigabytes building filter taps
    monkeypatch.setattr(R, "lowpass_taps", lambda up, down: built.append((up, down)))
    path = tmp_path / f"rate{rate}.wav"
    path.write_bytes(make_wav(np.zeros(48000, "<i2").tobytes(), rate=rate))
    with pytest.raises(FormatError) as e:
        A.load_audio(path)
    assert built == []  # refused from the header, before any filter is built
    assert path.name in str(e.value) and f"{rate} Hz" in str(e.value) and "1000-768000 Hz" in str(e.value)


def test_resampler_work_is_bounded_for_any_rates(monkeypatch):
    R = importlib.import_module("tallow.audio.resample")  # the module; tallow.audio.resample is also a function
    from tallow.audio.resample import HALF_TAPS_PER_RATE, MAX_RATIO_TERMS, rate_ratio
    for orig in (7919, 767_999, 44_101, 1001, 999_983, 31_999_999):
        up, down = rate_ratio(orig, 16000)
        assert max(up, down) <= MAX_RATIO_TERMS
        assert abs(up / down / (16000 / orig) - 1) < 2e-5  # 0.2 s over 3 hours at worst
    taps = []
    build = R.lowpass_taps

    def counted(up, down):
        built = build(up, down)
        taps.append(len(built[0]))
        return built
    monkeypatch.setattr(R, "lowpass_taps", counted)
    R._phase_table.cache_clear()  # built here, not taken from an earlier test's cache
    y = A.resample(np.ones(1000), 999_983, 16000)  # a prime rate: 16000/999983 in lowest terms
    assert len(y) == -(-1000 * 16000 // 999_983)
    # the filter's size follows the reduced ratio, not the rates (999983 x 16000 would be gigabytes)
    assert len(taps) == 1 and taps[0] <= 2 * HALF_TAPS_PER_RATE * MAX_RATIO_TERMS + 1
    with pytest.raises(Error, match="differ by more than a factor of 2000"):
        A.resample(np.ones(10), 2**31, 16000)


@pytest.mark.parametrize("rate", [44100, 22050, 8000, 11025, 96000, 7919])
def test_odd_but_valid_rates_resample_like_scipy(tmp_path, rate):
    signal = pytest.importorskip("scipy.signal")
    from math import gcd
    x = _tone_wav(tmp_path / "t.wav", rate, 0.5)
    g = gcd(rate, 16000)
    ref = signal.resample_poly(x, 16000 // g, rate // g)  # the exact ratio, e.g. 16000/7919
    y = np.asarray(A.load_audio(tmp_path / "t.wav"), np.float64)
    assert len(y) == len(ref) == -(-len(x) * 16000 // rate)
    # exact ratios agree to float32 rounding; 7919 Hz is resampled at 1679/831 (8e-8 off: the
    # samples drift 3e-4 of a sample over this 0.5 s, so they differ by up to 3e-4 of full scale)
    np.testing.assert_allclose(y, ref, atol=1e-6 if max(16000 // g, rate // g) <= 2000 else 1e-3, rtol=0)


@pytest.mark.parametrize("use_numpy", PATHS)
def test_streaming_resampler_equals_one_shot(use_numpy):
    x = _signal(7000 if use_numpy else 2500, seed=3)[:, 0].astype(np.float32)
    whole = np.asarray(A.resample(x, 44100, 16000, use_numpy=use_numpy))
    r = A.Resampler(44100, 16000, use_numpy=use_numpy)
    rng = np.random.default_rng(1)
    parts, pos = [], 0
    while pos < len(x):
        n = int(rng.integers(1, 900))
        parts.append(np.asarray(r.process(x[pos:pos + n] if use_numpy else list(x[pos:pos + n])), np.float32))
        pos += n
    parts.append(np.asarray(r.finish(), np.float32))
    assert np.array_equal(np.concatenate(parts), whole)  # the same sums in the same order


def test_stream_audio_wav_equals_whole_file_decoding(tmp_path):
    path = tmp_path / "stereo44k.wav"
    _tone_wav(path, 44100, 3.0, channels=2)
    samples, info = A.decode_wav(path.read_bytes())
    whole = np.asarray(A.resample(samples, info.sample_rate, 16000), np.float32)
    chunks = list(A.stream_audio(path, chunk_seconds=0.37))
    assert len(chunks) > 5
    assert np.array_equal(np.concatenate(chunks), whole)
    assert np.array_equal(np.concatenate(list(A.stream_audio(path.read_bytes(), chunk_seconds=1))), whole)
    assert np.array_equal(np.asarray(A.load_audio(path)), whole)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed on this machine")
@pytest.mark.parametrize("ext", ["mp3", "flac"])
def test_stream_audio_ffmpeg_equals_ffmpeg_itself(tmp_path, ext):
    wav, coded = tmp_path / "t.wav", tmp_path / f"t.{ext}"
    _tone_wav(wav, 44100, 3.0)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(wav), str(coded)], check=True)

    def ffmpeg(source, data=None):
        cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-i", source,
               "-f", "f32le", "-ac", "1", "-ar", "16000", "pipe:1"]
        return np.frombuffer(subprocess.run(cmd, input=data, check=True, capture_output=True).stdout, "<f4")

    chunks = list(A.stream_audio(coded, chunk_seconds=0.5))
    assert len(chunks) > 4
    assert np.array_equal(np.concatenate(chunks), ffmpeg(str(coded)))
    # bytes (the browser's way) go through a pipe, where ffmpeg cannot seek to trim an mp3's end padding
    data = coded.read_bytes()
    assert np.array_equal(np.concatenate(list(A.stream_audio(data, chunk_seconds=0.5))), ffmpeg("pipe:0", data))


def test_streaming_a_long_wav_keeps_memory_bounded(tmp_path):
    import tracemalloc
    path = tmp_path / "long.wav"  # 4 minutes at 48 kHz: 23 MB
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48000)
        block = (np.sin(np.arange(48000) * 0.05) * 8000).astype("<i2").tobytes()
        for _ in range(240):
            w.writeframes(block)
    tracemalloc.start()
    try:
        n = sum(len(c) for c in A.stream_audio(path, chunk_seconds=2))  # memory follows the chunk, not the file
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 240 * 16000
    assert peak < path.stat().st_size / 4, (f"peak {peak / 1e6:.1f} MB while streaming "
                                            f"a {path.stat().st_size / 1e6:.0f} MB file")


@pytest.mark.parametrize("use_numpy", PATHS)
def test_nan_and_inf_samples_are_a_format_error(tmp_path, use_numpy):
    x = np.zeros(20000, "<f4")
    x[1234], x[5000], x[19999] = np.nan, np.inf, -np.inf
    path = tmp_path / "broken.wav"
    path.write_bytes(make_wav(x.tobytes(), code=3, bits=32, rate=22050))
    with pytest.raises(FormatError) as e:
        A.load_audio(path, use_numpy=use_numpy)
    msg = str(e.value)
    assert "broken.wav" in msg and "3 of 20000 samples are NaN, infinite or larger than 100 in magnitude" in msg and "sample 1234" in msg, msg


@pytest.mark.parametrize("use_numpy", PATHS)
@pytest.mark.parametrize("bits, huge", [(32, 1e20), (32, 3e38), (32, -101.0), (64, 1e300), (64, 32767.0)])
def test_huge_finite_samples_are_a_format_error(tmp_path, use_numpy, bits, huge):
    """1e20 overflowed the float32 power spectrum to NaN and 1 s transcribed as "!!!!..." (exit 0);
    float64's 1e300 becomes inf in float32; 32767 is an int16 value stored as a float."""
    x = np.zeros(20000, f"<f{bits // 8}")
    x[700], x[19000] = huge, 100.0  # 100 is the largest magnitude allowed
    path = tmp_path / "loud.wav"
    path.write_bytes(make_wav(x.tobytes(), code=3, bits=bits, rate=22050))
    with pytest.raises(FormatError) as e:
        A.load_audio(path, use_numpy=use_numpy)
    msg = str(e.value)
    assert "loud.wav: 1 of 20000 samples are NaN, infinite or larger than 100 in magnitude" in msg, msg
    assert "the first at sample 700, 0.03 s" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("use_numpy", PATHS)
def test_log_mel_refuses_samples_that_overflow_and_is_exact_at_the_limit(use_numpy):
    jfk = np.frombuffer(A.load_audio(JFK), np.float32)[:8000]
    loudest = jfk * np.float32(100 / np.abs(jfk).max())  # peaks at exactly the limit
    mel = np.array([list(r) for r in A.log_mel_spectrogram(loudest, use_numpy=use_numpy)], np.float32)
    quiet = np.array([list(r) for r in A.log_mel_spectrogram(loudest / 100, use_numpy=use_numpy)], np.float32)
    assert np.isfinite(mel).all()
    np.testing.assert_allclose(mel, quiet + 1.0, atol=1e-4)  # log10 of 100^2 = 4, and (x + 4) / 4
    for bad in (np.full(8000, 1e20, np.float32), np.array([0.0] * 500 + [-32768] * 10, np.int16)):
        with pytest.raises(Error, match=r"log_mel_spectrogram: \d+ of \d+ samples are NaN, infinite or larger"):
            A.log_mel_spectrogram(bad, use_numpy=use_numpy)
    x = np.zeros((A.N_FRAMES - 1) * A.HOP_LENGTH + A.N_FFT, np.float32)
    x[-1] = 3e38
    with pytest.raises(Error, match="log_mel_frames: 1 of"):
        A.mel.log_mel_frames(x, A.N_FRAMES, use_numpy=use_numpy)


def test_mel_windows_equal_the_whole_audio_log_mel():
    from tallow.audio.mel_windows import MelWindows
    jfk = np.frombuffer(A.load_audio(JFK), np.float32)
    audio = np.concatenate([jfk, jfk])  # 22 s; the copies are 1100 frames apart and have the same maximum
    whole = A.log_mel_spectrogram(audio, padding=A.N_SAMPLES)
    windows = MelWindows([audio[i:i + 7777] for i in range(0, len(audio), 7777)])
    assert windows.has_frames(0) and windows.frames_from(0) == 2200
    for seek in (0, 1100):
        np.testing.assert_allclose(windows.window(seek), whole[:, seek:seek + 3000], atol=1e-6, rtol=0)
    assert not windows.has_frames(2200) and windows.duration == 22.0
    python = MelWindows([A.load_audio(JFK)], use_numpy=False).window(0)
    single = A.log_mel_spectrogram(jfk, padding=A.N_SAMPLES)[:, :3000]
    np.testing.assert_allclose(np.array([list(r) for r in python]), single, atol=2e-4, rtol=0)


def test_wav_blocks_stay_small_for_wide_frames(tmp_path):
    """8 channels of float64 at 768 kHz: a 10 s chunk would be 490 MB; blocks stay at 4 MiB."""
    from tallow.audio.wav import MAX_BLOCK_BYTES, open_wav, read_blocks
    x = np.zeros((100_000, 8), "<f8")  # 6.4 MB
    x[:, 3] = np.linspace(-0.5, 0.5, len(x))
    path = tmp_path / "wide.wav"
    path.write_bytes(make_wav(x.tobytes(), code=3, channels=8, rate=768000, bits=64))
    with open(path, "rb") as fh:
        info, offset, size = open_wav(fh, path.name)
        blocks = list(read_blocks(fh, info, offset, size, frames_per_block=10 * 768000))
    assert len(blocks) == 2 and all(len(b) * 64 <= MAX_BLOCK_BYTES for b in blocks)
    np.testing.assert_allclose(np.concatenate(blocks), x.mean(axis=1), atol=1e-7)
