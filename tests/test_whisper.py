"""Whisper: the model against transformers (random weights, 80 and 128 mel bins),
decoding against transformers' generate, and transcription of real speech
(Whisper tiny.en on jfk.wav) against its known transcript."""
import json
import re
from array import array
from pathlib import Path

import pytest

import tallow
from tallow.models import whisper
from tallow.models import whisper_logits
from tallow.models.whisper_decoding import DecodingOptions, decode

JFK = Path(__file__).parent / "data" / "jfk.wav"
SENTENCE = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def _words(text):
    return re.sub(r"[^a-z ]", "", text.lower()).split()


# ---- random weights vs transformers ---------------------------------------------------------
def _random_checkpoint(tmp_path, n_mels, positions):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(n_mels)
    cfg = transformers.WhisperConfig(
        vocab_size=1000, num_mel_bins=n_mels, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=positions, max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1)
    ref = transformers.WhisperForConditionalGeneration(cfg).eval()
    # random LayerNorm affines too, so a mix-up of weight names cannot hide
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    return torch, ref


@pytest.mark.emulated_model
def test_random_weights_match_transformers(tmp_path, device, slow_device):
    _check_random_weights(tmp_path, 80, device, positions=20 if slow_device else 100, decode_steps=2 if slow_device else 8)


def test_random_weights_with_128_mels_match_transformers(tmp_path):
    _check_random_weights(tmp_path, 128, "cpu")  # large-v3's mel count: the shapes, not the device


def _check_random_weights(tmp_path, n_mels, device, positions=100, decode_steps=8):
    torch, ref = _random_checkpoint(tmp_path, n_mels, positions)
    model = whisper.load(tmp_path, device=device)
    feats = torch.randn(1, n_mels, 2 * positions)  # 2 * max_source_positions frames
    prompt, steps = [1, 5, 7, 9], [11, 12, 13, 14, 15, 16, 17, 18][:decode_steps]
    with torch.no_grad():
        enc = ref.model.encoder(feats).last_hidden_state[0]
        logits = ref(input_features=feats, decoder_input_ids=torch.tensor([prompt + steps])).logits[0]

    features = model.encode(tallow.tensor(feats.tolist()))
    assert features.shape == (1, positions, 64)
    assert (features.numpy()[0] - enc.numpy()).__abs__().max() <= 1e-4

    state = model.start(features)
    got = model.decode_step([prompt], state, positions=None)[0].numpy()
    assert abs(got - logits[:len(prompt)].numpy()).max() <= 1e-4
    for i, token in enumerate(steps):  # one token at a time through the KV cache
        got = model.decode_step([[token]], state)[0, 0].numpy()
        assert abs(got - logits[len(prompt) + i].numpy()).max() <= 1e-4, f"decode step {i}"


def test_bad_config_and_missing_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 64}))
    with pytest.raises(tallow.FormatError, match="encoder_layers"):
        whisper.load(tmp_path)
    with pytest.raises(tallow.Error, match="no such model directory"):
        whisper.load(tmp_path / "absent")


# ---- real weights: Whisper tiny.en ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(whisper_tiny_dir):
    return whisper.load(whisper_tiny_dir, device="cpu")


@pytest.fixture(scope="module")
def jfk_features(tiny):
    from tallow.models.whisper_transcribe import _Mel
    mel = _Mel(str(JFK), 80, tiny.mel_filters)
    return mel, tiny.encode(mel.window(0))


def test_cli_transcribes_jfk_exactly(tiny, capsys):
    from tallow.cli import main
    code = main(["transcribe", str(JFK), "--model", str(tiny.name), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip() == SENTENCE
    assert re.search(r"11\.0 s of audio \(en\) in [\d.]+ s on cpu: real-time factor [\d.]+", err), err


def test_jfk_timestamps(tiny):
    result = tiny.transcribe(str(JFK), temperature=0.0)
    assert result.language == "en"
    assert _words(result.text) == _words(SENTENCE)  # timestamp mode drops tiny.en's comma
    assert len(result.segments) >= 1
    for seg in result.segments:
        assert 0 <= seg.start < seg.end <= 11.1, seg
    assert all(a.end <= b.start + 1e-6 for a, b in zip(result.segments, result.segments[1:]))
    srt = result.to_srt()
    assert srt.startswith("1\n00:00:00,000 --> ") and "ask what you can do" in srt
    assert json.loads(result.to_json())["segments"][0]["start"] == result.segments[0].start


def test_timestamp_decoding_matches_transformers(tiny, jfk_features):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    mel, features = jfk_features
    ref = transformers.WhisperForConditionalGeneration.from_pretrained(tiny.name, torch_dtype=torch.float32).eval()
    window = torch.from_numpy(mel.window(0).numpy())
    with torch.no_grad():
        want = ref.generate(window, return_timestamps=True, max_new_tokens=100)
    want = [t for t in want[0].tolist() if t != tiny.tokens.eot]
    got = decode(tiny, features, DecodingOptions(language="en"))
    assert got.tokens == want


def test_pure_python_logit_path_gives_same_tokens(tiny, jfk_features, monkeypatch):
    """The logit filters on the pure-Python host backend (Pyodide without numpy) decode the same tokens."""
    _, features = jfk_features
    with_numpy = decode(tiny, features, DecodingOptions())
    monkeypatch.setattr(whisper_logits, "host_device", lambda: tallow.Device("python"))
    without = decode(tiny, features, DecodingOptions())
    assert without.tokens == with_numpy.tokens
    assert abs(without.sum_logprob - with_numpy.sum_logprob) < 1e-3


@pytest.mark.parametrize("host", ["cpu", "python"])
def test_logit_rows_match_numpy_on_either_host_backend(host, monkeypatch):
    import random
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(whisper_logits, "host_device", lambda: tallow.Device(host))
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 5000)).astype(np.float32) * 4
    data[1, 17] = data[1, 4000] = data[1].max() + 1  # a tie: the lower id wins
    rows = whisper_logits.logit_rows(tallow.from_numpy(data))
    rows.suppress(0, 100, 200)
    rows.suppress(None, 4990)
    rows.suppress_ids([5, 6, 6])
    ref = data.copy()
    ref[0, 100:200] = ref[:, 4990:] = ref[:, [5, 6]] = -np.inf
    np.testing.assert_array_equal(rows.a.numpy(), ref)
    assert data[0, 150] != -np.inf  # the caller's logits are untouched
    for k in range(3):
        row = ref[k].astype(np.float64)
        assert rows.argmax(k) == int(np.argmax(ref[k]))
        assert rows.max(k, 0, 300) == ref[k, :300].max()
        for start in (0, 150, 4000):
            part = row[start:][np.isfinite(row[start:])]
            want = part.max() + np.log(np.exp(part - part.max()).sum())
            assert rows.logsumexp(k, start) == pytest.approx(want, rel=1e-6)
        lse = rows.logsumexp(k)
        order = np.lexsort((np.arange(5000), -ref[k]))[:6]  # by value, ties by lower id
        top = rows.topk(k, 6, lse)
        assert [t for _, t in top] == order.tolist()
        assert [v for v, _ in top] == pytest.approx((ref[k, order] - lse).tolist(), abs=1e-5)
        for seed in range(3):
            z = row / 0.7
            c = np.cumsum(np.exp(z - z.max()))
            want = int(np.searchsorted(c, random.Random(seed).random() * c[-1], side="right"))
            assert rows.sample(k, 0.7, random.Random(seed)) == want
    assert rows.max(0, 4990) == rows.logsumexp(0, 4990) == float("-inf")
    tiny_rows = whisper_logits.logit_rows(tallow.tensor([[1.0, 2.0, 0.5]]))
    tiny_rows.suppress(0, 1)
    assert tiny_rows.topk(0, 3, 0.0) == [(1.0, 0), (float("-inf"), 1), (float("-inf"), 2)]


def test_beam_search_jfk(tiny):
    result = tiny.transcribe(str(JFK), beam_size=5, timestamps=False)
    assert result.text.strip() == SENTENCE


@pytest.mark.parametrize("option", [dict(beam_size=100_000), dict(beam_size=17), dict(beam_size=0),
                                    dict(beam_size=2.5), dict(best_of=17, temperature=0.5),
                                    dict(beam_size=5, patience=float("inf")), dict(beam_size=5, patience=0)])
def test_search_width_is_bounded_before_any_work(tiny, monkeypatch, option):
    """--beam-size 100000 asked numpy for 64 GiB; 3000 grew to 16 GB: refused before the audio is read."""
    from tallow.models import whisper_transcribe as wt
    monkeypatch.setattr(wt, "_Mel", lambda *a: pytest.fail("the audio was read"))
    name = "patience" if "patience" in option else next(iter(option))
    with pytest.raises(tallow.Error, match=f"whisper: {name} must be"):
        tiny.transcribe(str(JFK), **option)
    with pytest.raises(tallow.Error, match=f"whisper: {name} must be"):
        DecodingOptions(**option)


def test_the_widest_beam_allowed_decodes(tiny, jfk_features):
    from tallow.models.whisper_decoding import MAX_BEAM_SIZE
    _, features = jfk_features
    result = decode(tiny, features, DecodingOptions(beam_size=MAX_BEAM_SIZE, sample_len=6, without_timestamps=True))
    assert SENTENCE.startswith(result.text.strip()) and result.text.strip()


def test_audio_as_samples_and_bad_input(tiny, tmp_path):
    with pytest.raises(tallow.Error, match="English-only"):
        tiny.transcribe(array("f", [0.0] * 16000), language="de")
    bad = tmp_path / "notes.wav"
    bad.write_bytes(b"this is not audio at all" * 10)
    with pytest.raises(tallow.FormatError, match="notes.wav"):
        tiny.transcribe(str(bad))


# ---- streaming, hostile input, threads --------------------------------------------------------
def _write_wav(path, samples, rate=16000):
    import wave
    np = pytest.importorskip("numpy")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(np.asarray(samples) * 32768).clip(-32768, 32767).astype("<i2").tobytes())


def test_long_form_three_times_streamed_from_a_file(tiny, tmp_path, monkeypatch):
    """jfk.wav three times (33 s): every sentence found; from a file, the first segment comes
    before the audio is read to its end, and the result is that of the same samples passed whole."""
    np = pytest.importorskip("numpy")
    from tallow.models import whisper_transcribe as wt
    samples = np.concatenate([np.frombuffer(tallow.audio.load_audio(str(JFK)), np.float32)] * 3)
    result = tiny.transcribe(samples, temperature=0.0)
    assert result.duration > 32
    assert result.segments[-1].end > 30 and result.segments[0].start < 1
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts)
    words = " ".join(_words(result.text))
    assert words.count("ask not what your country can do for you") == 3, result.text
    assert words.count("ask what you can do for your country") == 3, result.text

    path = tmp_path / "jfk3.wav"
    _write_wav(path, samples)  # jfk.wav is 16-bit: the same samples
    read = []

    def counting_stream(source):
        for chunk in tallow.audio.stream_audio(source, chunk_seconds=1):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(wt, "stream_audio", counting_stream)
    read_at_segment = []
    streamed = tiny.transcribe(str(path), temperature=0.0, on_segment=lambda s: read_at_segment.append(len(read)))
    assert len(read) == 33
    assert read_at_segment[0] == 31 < len(read)  # the first window needs 30 s and the frame after
    assert streamed.text == result.text and streamed.duration == result.duration
    assert [(s.start, s.end, s.text) for s in streamed.segments] == [(s.start, s.end, s.text) for s in result.segments]


def test_nan_wav_is_a_clear_cli_error(tiny, tmp_path, capsys):
    import struct
    np = pytest.importorskip("numpy")
    from tallow.cli import main
    x = np.zeros(16000, "<f4")
    x[100:110] = np.nan
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", x.nbytes) + x.tobytes()
    path = tmp_path / "nan.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    code = main(["transcribe", str(path), "--model", str(tiny.name), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "nan.wav: 10 of 16000 samples are NaN, infinite or larger than 100 in magnitude (the first at sample 100" \
        in err, err
    with pytest.raises(tallow.Error, match="NaN, infinite or larger"):
        tiny.transcribe(x)  # samples in memory too


def _float_wav(path, x):
    import struct
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", x.nbytes) + x.tobytes()
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


@pytest.mark.parametrize("huge", [1e20, 3e38])
def test_huge_samples_are_a_clear_cli_error_in_any_window(tiny, tmp_path, capsys, huge):
    """1 s of 1e20 overflowed the log-mel to NaN: "!!!!..." and exit 0. Refused in the first window,
    and in a later one (tallow transcribe reads long files window by window)."""
    np = pytest.importorskip("numpy")
    from tallow.cli import main
    short = np.random.default_rng(0).uniform(-1, 1, 16000).astype("<f4") * np.float32(huge)
    long = np.zeros(45 * 16000, "<f4")
    long[40 * 16000 + 5] = huge  # read only when the second 30 s window is due
    for name, x, first in (("short.wav", short, "the first at sample 0, 0.00 s"),
                           ("long.wav", long, "1 of 720000 samples are NaN, infinite or larger than 100 in magnitude "
                                              "(the first at sample 640005, 40.00 s")):
        _float_wav(tmp_path / name, x)
        code = main(["transcribe", str(tmp_path / name), "--model", str(tiny.name), "--device", "cpu"])
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and f"{name}: " in lines[0] and first in lines[0], err
        assert "larger than 100 in magnitude" in lines[0] and "!" not in out
    with pytest.raises(tallow.Error, match=r"whisper: audio samples: 16000 of 16000 .* larger than 100"):
        tiny.transcribe(short)


def test_two_threads_transcribe_like_one(tiny):
    import threading
    alone = tiny.transcribe(str(JFK), temperature=0.0).text
    results, errors = [None, None], []

    def work(i):
        try:
            results[i] = tiny.transcribe(str(JFK), temperature=0.0).text
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results == [alone, alone]
    assert _words(alone) == _words(SENTENCE)


@pytest.mark.parametrize("fmt", ["txt", "srt", "vtt"])
def test_cli_live_output_is_the_finished_transcript(fmt):
    """`tallow transcribe` prints segments as they come: the same text as the whole result's format()."""
    import io
    from types import SimpleNamespace

    from tallow.cli.transcribe import LiveTranscript
    from tallow.models.whisper_transcribe import Segment, TranscriptionResult
    r = SimpleNamespace(temperature=0.0, avg_logprob=-0.2, compression_ratio=1.1, no_speech_prob=0.01)
    texts = [(0.0, 2.5, " Hello there."), (2.5, 3.0, " "), (3.0, 3661.25, " And a long one.")]
    for segments in ([], [Segment(i, 0, s, e, t, [], r) for i, (s, e, t) in enumerate(texts)]):
        out = io.StringIO()
        live = LiveTranscript(fmt, out)
        for seg in segments:
            if seg.text:  # transcribe calls on_segment for segments with text
                live.add(seg)
        live.close()
        assert out.getvalue() == TranscriptionResult("", segments, "en", 3700.0).format(fmt)


# ---- int8 weights (quantize="q8_0") and the decoder's one thread --------------------------------------
def test_q8_0_weights_decode_jfk_like_float(tiny, jfk_features, whisper_tiny_dir):
    """Linear weights and the token embedding as q8_0 blocks (convs, positions and norms float): every
    token of jfk.wav's first window equals the float model's, and the sentence is exact."""
    q8 = whisper.load(whisper_tiny_dir, device="cpu", quantize="q8_0")
    dec, enc = q8.decoder.layers[0], q8.encoder.layers[0]
    for w in (dec.self_attn.qkv_proj.weight, dec.encoder_attn.k_proj.weight, dec.fc2.weight, enc.fc1.weight,
              enc.self_attn.out_proj.weight, q8.decoder.embed_tokens.weight):
        assert w.dtype.name == "q8_0"
    for w in (q8.encoder.conv1.weight, q8.decoder.embed_positions.weight, dec.fc1.bias, dec.final_layer_norm.weight):
        assert w.dtype.name == "f32"
    mel, features = jfk_features
    want = decode(tiny, features, DecodingOptions(language="en"))
    got = decode(q8, q8.encode(mel.window(0)), DecodingOptions(language="en"))
    assert got.tokens == want.tokens
    assert abs(got.avg_logprob - want.avg_logprob) < 0.02
    assert q8.transcribe(str(JFK), timestamps=False).text.strip() == SENTENCE


def test_bad_quantize_choice_is_a_clear_error(tiny, capsys):
    from tallow.cli import main
    with pytest.raises(tallow.Error, match=r"cannot quantise the weights to 'int8'; choices: q8_0"):
        whisper.load(tiny.name, quantize="int8")
    code = main(["transcribe", str(JFK), "--model", "/no/such/model", "--quantize", "q4"])
    _, err = capsys.readouterr()
    assert code == 2 and "choices: q8_0" in err and "no such model" not in err  # checked before the load


def test_one_thread_limits_blas_and_numba_then_restores():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    numba = pytest.importorskip("numba")
    np = pytest.importorskip("numpy")
    from tallow.models.decode_threads import one_thread

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    np.ones((2, 2)) @ np.ones((2, 2))  # BLAS loaded
    before_blas, before_numba = blas_threads(), numba.get_num_threads()
    with one_thread():
        assert blas_threads() and set(blas_threads()) == {1}
        assert numba.get_num_threads() == 1
    assert blas_threads() == before_blas and numba.get_num_threads() == before_numba

    # a decode in another Python thread leaves BLAS alone (OpenBLAS takes a raise back only
    # from the main thread): limits numba's threads there, BLAS keeps its count throughout
    import threading
    seen = []

    def elsewhere():
        with one_thread():
            seen.append((blas_threads(), numba.get_num_threads()))

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join(10)
    assert seen == [(before_blas, 1)]
    assert blas_threads() == before_blas
