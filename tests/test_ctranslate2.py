"""tallow.io.ctranslate2 (model.bin reader) and the CTranslate2 -> Hugging Face
Whisper conversion.

References: files written by CTranslate2's own serializer (ctranslate2.specs),
the real Whisper tiny.en model.bin checked against its published architecture,
transformers' WhisperForConditionalGeneration loading the converted directory
and transcribing jfk.wav, and CTranslate2's own Whisper on the same features.
"""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

import tallow.audio as A
from tallow import hub
from tallow.errors import FormatError
from tallow.io.ctranslate2 import load_ctranslate2

JFK = Path(__file__).parent / "data" / "jfk.wav"
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


@pytest.fixture(scope="module")
def ct2_dir():
    return hub.fetch("whisper-tiny.en-ct2", progress=False)


@pytest.fixture(scope="module")
def hf_dir():
    return hub.fetch("whisper-tiny.en", progress=False)


# ---- reader vs CTranslate2's own writer ---------------------------------------------
def _ct2_written_file(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    torch = pytest.importorskip("torch")
    from ctranslate2.specs import model_spec

    values = {
        "layer/weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
        "layer/scale": np.array([1, -2, 3], dtype=np.int8),
        "steps": np.arange(-2, 3, dtype=np.int16),
        "half": (np.arange(8, dtype=np.float16) / 5).reshape(2, 2, 2),
        "count": np.int32(7),
        "table": np.arange(6, dtype=np.int32).reshape(2, 3),
        "copy": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,  # identical: CT2 stores an alias
    }

    class Layer(model_spec.LayerSpec):
        def __init__(self):
            self.weight = values["layer/weight"]
            self.scale = values["layer/scale"]

    class Toy(model_spec.ModelSpec):
        def __init__(self):
            super().__init__()
            self.layer = Layer()
            self.steps, self.half, self.count = values["steps"], values["half"], values["count"]
            self.table, self.copy = values["table"], values["copy"]
            self.brain = torch.arange(4, dtype=torch.bfloat16) / 8

        @property
        def name(self):
            return "ToySpec"

    spec = Toy()
    spec.validate()
    spec.optimize()  # merges identical variables into aliases
    path = tmp_path / "model.bin"
    spec._serialize(str(path))
    values["brain"] = (np.arange(4, dtype=np.float32) / 8).view(np.uint32) >> 16
    return path, values, ctranslate2


def test_reader_matches_ctranslate2_writer(tmp_path):
    path, values, _ = _ct2_written_file(tmp_path)
    with load_ctranslate2(path) as f:
        assert f.spec == "ToySpec" and f.version >= 6
        assert set(f.keys()) == set(values)
        assert f.aliases, "CTranslate2 should have stored the duplicate as an alias"
        expected_dtypes = {"layer/weight": "f32", "layer/scale": "i8", "steps": "i16", "half": "f16",
                           "count": "i32", "table": "i32", "copy": "f32", "brain": "bf16"}
        for name, v in values.items():
            t = f[name]
            assert t.dtype == expected_dtypes[name], name
            assert t.shape == np.shape(v), name
            assert np.array_equal(t.numpy(), np.asarray(v).astype(t.numpy().dtype)), name


@pytest.mark.parametrize("device", ["cpu", "python"])
def test_entries_become_tallow_tensors(tmp_path, device):
    path, values, _ = _ct2_written_file(tmp_path)
    with load_ctranslate2(path) as f:
        for name in ("layer/weight", "half", "table", "layer/scale"):
            t = f[name].tensor(device=device)
            assert t.shape == np.shape(values[name]) and t.dtype.name == f[name].dtype
            assert np.array_equal(np.asarray(t.tolist()), values[name])
        steps = f["steps"].tensor(device=device)  # tallow has no i16: widened
        assert steps.dtype.name == "i32" and steps.tolist() == values["steps"].tolist()


@pytest.mark.parametrize("cut", [3, 9, 30, 60, -5, -1])
def test_truncated_file_is_format_error_naming_path(tmp_path, cut):
    path, _, _ = _ct2_written_file(tmp_path)
    blob = path.read_bytes()
    bad = tmp_path / "cut.bin"
    bad.write_bytes(blob[:cut])
    with pytest.raises(FormatError, match=r"cut\.bin.*(file ends inside|unexpected bytes|unknown tensor)"):
        load_ctranslate2(bad)


def _one_tensor_file(version=6, dtype=0, nbytes=8, data=bytes(8), trailing=b""):
    spec = b"Toy\0"
    name = b"w\0"
    head = (struct.pack("<I", version) + struct.pack("<H", len(spec)) + spec
            + struct.pack("<I", 1) + struct.pack("<I", 1))
    tensor = (struct.pack("<H", len(name)) + name + struct.pack("<BI", 1, 2) + struct.pack("<B", dtype)
              + struct.pack("<I", nbytes) + data)
    return head + tensor + struct.pack("<I", 0) + trailing


def test_hand_written_file_and_corruptions():
    f = load_ctranslate2(_one_tensor_file())
    assert f["w"].shape == (2,) and f["w"].numpy().tolist() == [0.0, 0.0]
    cases = [
        (_one_tensor_file(version=99), "unsupported version 99"),
        (_one_tensor_file(dtype=9), "unknown dtype code 9"),
        (_one_tensor_file(nbytes=6, data=bytes(6)), "needs 8 bytes, header says 6"),
        (_one_tensor_file(trailing=b"xx"), "2 unexpected bytes"),
        (b"", "file ends inside version"),
    ]
    for blob, message in cases:
        with pytest.raises(FormatError, match=message):
            load_ctranslate2(blob)


# ---- the real tiny.en model ---------------------------------------------------------
def test_real_tiny_en_model_bin(ct2_dir):
    with load_ctranslate2(ct2_dir / "model.bin") as f:
        assert (f.version, f.spec) == (6, "WhisperSpec")
        assert len(f.tensors) == 148
        assert f.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
        assert f["decoder/projection/weight"] is f["decoder/embeddings/weight"]
        # Whisper tiny.en: d_model 384, 4+4 layers, 6 heads, 80 mel bins, vocab 51864, fp16
        assert f["decoder/embeddings/weight"].shape == (51864, 384)
        assert f["encoder/conv1/weight"].shape == (384, 80, 3)
        assert f["encoder/position_encodings/encodings"].shape == (1500, 384)
        assert f["decoder/position_encodings/encodings"].shape == (448, 384)
        assert f["encoder/num_heads"].numpy() == 6 and f["decoder/num_heads"].numpy() == 6
        assert sum(1 for k in f.tensors if k.endswith("self_attention/linear_0/weight")) == 8
        assert f["decoder/layer_3/attention/linear_1/weight"].shape == (768, 384)
        assert all(t.dtype == "f16" for t in f.tensors.values() if len(t.shape) == 2)
        # whisper's key projections have no bias: CTranslate2 stores zeros
        assert not f["encoder/layer_0/self_attention/linear_0/bias"].numpy()[384:768].any()


def test_converted_directory_has_transformers_names_and_config(hf_dir, ct2_dir):
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    expected = {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
                "decoder_attention_heads": 6, "vocab_size": 51864, "num_mel_bins": 80, "max_source_positions": 1500,
                "max_target_positions": 448, "decoder_start_token_id": 50257, "eos_token_id": 50256,
                "pad_token_id": 50256, "bos_token_id": 50257, "forced_decoder_ids": [[1, 50362]]}
    assert {k: config[k] for k in expected} == expected
    ref = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config)).state_dict()
    ref.pop("proj_out.weight")  # tied to the token embedding
    ours = load_file(str(hf_dir / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in ref.items()}
    with load_ctranslate2(ct2_dir / "model.bin") as f:  # q/k/v split in the right order
        qkv = f["decoder/layer_2/self_attention/linear_0/weight"].numpy()
        assert np.array_equal(ours["model.decoder.layers.2.self_attn.v_proj.weight"], qkv[768:])
        kv = f["decoder/layer_1/attention/linear_1/bias"].numpy()
        assert np.array_equal(ours["model.decoder.layers.1.encoder_attn.v_proj.bias"], kv[384:])


@pytest.fixture(scope="module")
def jfk_features():
    return A.log_mel_spectrogram(A.pad_or_trim(A.load_audio(JFK)))


@pytest.mark.slow
# newer transformers name it `cache`
@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_converted_whisper_transcribes_jfk_with_transformers(hf_dir, jfk_features):
    """Proves converter, weights and log-mel at once: greedy decoding in transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        str(hf_dir), torch_dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    model.eval()
    ids = [50257, 50362]  # <|startoftranscript|> <|notimestamps|>
    with torch.no_grad():
        encoded = model.model.encoder(torch.from_numpy(jfk_features)[None]).last_hidden_state
        step, past = torch.tensor([ids]), None
        for _ in range(60):  # greedy, with the KV cache
            out = model(encoder_outputs=(encoded,), decoder_input_ids=step, past_key_values=past, use_cache=True)
            token = int(out.logits[0, -1].argmax())
            if token == 50256:  # <|endoftext|>
                break
            ids.append(token)
            step, past = torch.tensor([[token]]), out.past_key_values
    text = tokenizers.Tokenizer.from_file(str(hf_dir / "tokenizer.json")).decode(ids, skip_special_tokens=True)
    assert text.strip() == JFK_TEXT


@pytest.mark.slow
def test_ctranslate2_itself_transcribes_our_features(ct2_dir, jfk_features):
    """CTranslate2 on its own model.bin, fed tallow's log-mel: the same transcript."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    tokenizers = pytest.importorskip("tokenizers")
    model = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type="float32")
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(jfk_features[None]))
    result = model.generate(features, [[50257, 50362]], beam_size=1)
    text = tokenizers.Tokenizer.from_file(str(ct2_dir / "tokenizer.json")).decode(result[0].sequences_ids[0])
    assert text.strip() == JFK_TEXT
