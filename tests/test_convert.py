"""`tallow convert` / tallow.convert: CTranslate2 Whisper folders into Hugging Face layout.

References: tiny random-weight WhisperForConditionalGeneration models saved by
transformers and converted to model.bin by CTranslate2's own TransformersConverter
(an English-only vocabulary and a multilingual one); transformers on the original
gives the logits, transformers on the converted folder runs generate(language=...,
task=...), the `tokenizers` library and transformers' LANGUAGES table give the ids;
the real whisper-tiny.en model.bin converts to the folder `tallow fetch` made.
"""
import copy
import json
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow import hub
from tallow.cli import main as cli_main
from tallow.errors import Error, FormatError
from tallow.models import whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
ctranslate2 = pytest.importorskip("ctranslate2")


def _multilingual_tokenizer(english):
    """A multilingual Whisper tokenizer.json from the English-only one: the multilingual
    BPE vocabulary has one token more, so every special token sits one id higher (same
    99 languages, same order). No multilingual tokenizer file is available offline."""
    t = copy.deepcopy(english)
    for token in t["added_tokens"]:
        token["id"] += 1
    for special in t["post_processor"]["special_tokens"].values():
        special["ids"] = [i + 1 for i in special["ids"]]
    vocab = t["model"]["vocab"]
    vocab["<|filler|>"] = vocab.pop("<|endoftext|>")  # BPE never produces it
    vocab["<|endoftext|>"] = english["model"]["vocab"]["<|endoftext|>"] + 1
    return t


def _build(root, multilingual):
    """(transformers model, its HF folder, the CTranslate2 folder made from it)."""
    english = json.loads((hub.fetch("whisper-tiny.en", progress=False) / "tokenizer.json").read_text("utf-8"))
    tok = _multilingual_tokenizer(english) if multilingual else english
    hf = root / "hf"
    hf.mkdir(parents=True)
    (hf / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 448,
        "additional_special_tokens": [a["content"] for a in tok["added_tokens"]]}))
    ids = tokenizers.Tokenizer.from_file(str(hf / "tokenizer.json")).token_to_id
    sot, eot = ids("<|startoftranscript|>"), ids("<|endoftext|>")
    torch.manual_seed(7 + multilingual)
    cfg = transformers.WhisperConfig(
        vocab_size=51865 if multilingual else 51864, num_mel_bins=80, d_model=64, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=1500, max_target_positions=448,
        decoder_start_token_id=sot, pad_token_id=eot, eos_token_id=eot, bos_token_id=eot if multilingual else sot,
        suppress_tokens=[1, 2, 7], begin_suppress_tokens=[220, eot])
    ref = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # random norms and biases too, so a mix-up of names cannot hide
        for name, p in ref.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    ref.save_pretrained(hf)
    ct2 = root / "ct2"
    ctranslate2.converters.TransformersConverter(str(hf), copy_files=["tokenizer.json"]).convert(str(ct2))
    return ref, hf, ct2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (transformers model, HF folder, CTranslate2 folder, converted folder), built once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            ref, hf, ct2 = _build(root, kind == "multilingual")
            cache[kind] = ref, hf, ct2, tallow.convert(ct2, root / "converted")
        return cache[kind]
    return get


@pytest.fixture(params=["english", "multilingual"])
def built(request, models):
    return models(request.param)


def _features(seed=3):
    return torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(seed))


def test_logits_equal_transformers_on_the_original(built):
    ref, hf, _, out = built
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json"]
    model = whisper.load(out, device="cpu")
    feats = _features()
    sot = ref.config.decoder_start_token_id
    prompt, steps = [sot, sot + 2, 50, 220], [11, 12, 13, 14, 15, 16, 17, 18]
    with torch.no_grad():
        logits = ref(input_features=feats, decoder_input_ids=torch.tensor([prompt + steps])).logits[0].numpy()
    state = model.start(model.encode(tallow.tensor(feats.numpy())))
    got = model.decode_step([prompt], state, positions=None)[0].numpy()
    assert np.abs(got - logits[:len(prompt)]).max() <= 1e-4
    for i, token in enumerate(steps):  # one token at a time through the KV cache
        got = model.decode_step([[token]], state)[0, 0].numpy()
        assert np.abs(got - logits[len(prompt) + i]).max() <= 1e-4, f"decode step {i}"


def _decoder_prefix(model, **generate_args):
    """The forced prefix transformers' generate feeds the decoder: its longest input (a
    language detection pass feeds <|startoftranscript|> alone first; the KV-cache steps
    feed one token each)."""
    seen = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            seen.append(ids[0].tolist())

    handle = model.model.decoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.generate(_features(), max_new_tokens=3, **generate_args)
    finally:
        handle.remove()
    return max(seen, key=len)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_transformers_generates_from_the_converted_folder(built):
    ref, hf, ct2, out = built
    ids = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id
    model = transformers.WhisperForConditionalGeneration.from_pretrained(str(out)).eval()
    sot, no_ts, transcribe = ids("<|startoftranscript|>"), ids("<|notimestamps|>"), ids("<|transcribe|>")
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["alignment_heads"] == json.loads((ct2 / "config.json").read_text())["alignment_heads"]
    assert gen["suppress_tokens"] == [1, 2, 7] and gen["begin_suppress_tokens"] == [220, ids("<|endoftext|>")]
    assert gen["prev_sot_token_id"] == ids("<|startofprev|>")
    if not ref.config.vocab_size >= 51865:
        assert gen["is_multilingual"] is False and "lang_to_id" not in gen
        assert _decoder_prefix(model) == [sot, no_ts]
        return
    from transformers.models.whisper.tokenization_whisper import LANGUAGES
    # Whisper's vocabulary spells Hebrew "iw"; "yue" came with large-v3's extra token
    codes = ["iw" if code == "he" else code for code in LANGUAGES if code != "yue"]
    assert len(codes) == 99 and gen["lang_to_id"] == {f"<|{code}|>": ids(f"<|{code}|>") for code in codes}
    assert gen["task_to_id"] == {"translate": ids("<|translate|>"), "transcribe": transcribe}
    assert _decoder_prefix(model, language="de", task="transcribe") == [sot, ids("<|de|>"), transcribe, no_ts]
    assert _decoder_prefix(model, language="spanish", task="translate") == [
        sot, ids("<|es|>"), ids("<|translate|>"), no_ts]
    detected = _decoder_prefix(model)  # no language given: detected, then transcribe
    assert detected[0] == sot and detected[1] in gen["lang_to_id"].values() and detected[2:] == [transcribe, no_ts]


@pytest.mark.models  # reads (or fetches) the real tiny.en files, as the model fixtures do
def test_real_tiny_en_converts_to_what_fetch_made(tmp_path):
    from safetensors.numpy import load_file

    ct2_dir, fetched = hub.fetch("whisper-tiny.en-ct2", progress=False), hub.fetch("whisper-tiny.en", progress=False)
    out = tallow.convert(ct2_dir, tmp_path / "tiny.en")
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(fetched / "model.safetensors"))
    assert ours.keys() == theirs.keys() and len(ours) > 100  # names: checked against transformers in test_ctranslate2
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype and np.array_equal(ours[name], value), name
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (out / name).read_bytes() == (fetched / name).read_bytes(), name
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["forced_decoder_ids"] == [[1, 50362]] and gen["is_multilingual"] is False
    recipe = tmp_path / "recipe"  # the fetch recipe now goes through the same converter
    recipe.mkdir()
    tiny = hub.KNOWN["whisper-tiny.en"]
    assert tiny.build(recipe, tmp_path, False, {need: hub.fetch(need, progress=False) for need in tiny.needs}) == "."
    assert sorted(p.name for p in recipe.iterdir()) == sorted(p.name for p in fetched.iterdir() if p.name != ".complete")
    for p in recipe.iterdir():
        assert p.read_bytes() == (out / p.name if p.name != "mel_filters.npz" else fetched / p.name).read_bytes()


def _stacked_max(original, name):
    """Largest |w| of the CTranslate2 tensor that holds `name`: it stacks q/k/v of
    self-attention and k/v of cross-attention before quantising."""
    stem, _, proj = name.rpartition(".")[0].rpartition(".")
    stacked = {"self_attn": ("q_proj", "k_proj", "v_proj"), "encoder_attn": ("k_proj", "v_proj")}
    group = stacked.get(stem.rpartition(".")[2], ())
    names = [f"{stem}.{p}.weight" for p in group] if proj in group and name.endswith("weight") else [name]
    return max(float(original[n].abs().max()) for n in names)


# Each is a CTranslate2 conversion: the fast loop converts the two faster-whisper ships, `make test` all five.
@pytest.mark.parametrize("quantization", ["float16", "int8"] + [pytest.param(q, marks=pytest.mark.slow)
                                                                for q in ("bfloat16", "int8_float16", "int16")])
def test_float16_bfloat16_and_quantised_models(models, tmp_path, quantization):
    """faster-whisper ships float16 and int8 conversions: weights come back as the model's
    floats, within CTranslate2's rounding step of the original weights for the quantised ones."""
    from safetensors.torch import load_file

    ref, hf, _, _ = models("english")
    ct2 = tmp_path / "ct2"
    ctranslate2.converters.TransformersConverter(str(hf), copy_files=["tokenizer.json"]).convert(
        str(ct2), quantization=quantization)
    out = tallow.convert(ct2, tmp_path / "out")
    ours = load_file(str(out / "model.safetensors"))
    original = {k: v for k, v in ref.state_dict().items() if k != "proj_out.weight"}
    assert ours.keys() == original.keys()
    float_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "int8_float16": torch.float16}.get(
        quantization, torch.float32)
    for name, w in original.items():
        got = ours[name]
        assert got.dtype == float_dtype, name
        if quantization in ("float16", "bfloat16"):
            assert torch.equal(got, w.to(float_dtype)), name
            continue
        rows = w.reshape(len(w), -1) if w.dim() > 1 else w.reshape(-1, 1)
        if quantization == "int16":  # one scale per stored tensor: 2**10 steps up to its largest |w|
            step = _stacked_max(original, name) / 2 ** 10
        else:  # one scale per row: 127 steps up to the row's largest |w|
            step = rows.abs().amax(dim=1, keepdim=True).reshape(-1, *[1] * (w.dim() - 1)) / 127
        tolerance = step * 0.5 + w.abs() * 1e-3 + 1e-7  # half a step, plus f16 rounding of the result
        assert bool(((got.float() - w).abs() <= tolerance).all()), name
    model = whisper.load(out, device="cpu")  # tallow reads every dtype the converter writes
    assert model.config.vocab_size == 51864


def _suggested_command(message):
    command = message.split("`")[1]
    assert command.startswith("tallow convert ")
    return shlex.split(command)[2:]


def test_unconverted_folder_names_the_command_that_converts_it(built, tmp_path, capsys):
    _, _, ct2, _ = built
    src = tmp_path / "faster whisper"  # a space: the suggested command must quote it
    shutil.copytree(ct2, src)
    for load in (tallow.load_model, whisper.load, hub.fetch):
        for given in (src, src / "model.bin"):
            with pytest.raises(FormatError, match=r"is a CTranslate2 \(faster-whisper\) model") as caught:
                load(str(given))
    assert cli_main(["transcribe", "--model", str(src), str(Path(__file__).parent / "data" / "jfk.wav")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tallow transcribe: error: ") and "\n" not in err and "tallow convert" in err
    src_arg, dst_arg = _suggested_command(str(caught.value))
    assert Path(src_arg) == src
    assert cli_main(["convert", "--quiet", src_arg, dst_arg]) == 0  # the command works as given
    assert capsys.readouterr().out.strip() == dst_arg
    model = tallow.load_model(dst_arg)
    assert model.config.vocab_size in (51864, 51865)


def test_cli_convert_in_a_subprocess(built, tmp_path):
    _, _, ct2, _ = built
    run = subprocess.run([sys.executable, "-m", "tallow", "convert", str(ct2), str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tmp_path / "out") and "converted" in run.stderr
    again = subprocess.run([sys.executable, "-m", "tallow", "convert", str(ct2), str(tmp_path / "out")],
                           capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_bad_sources_and_destinations(built, tmp_path, capsys):
    _, hf, ct2, _ = built
    src = tmp_path / "src"
    shutil.copytree(ct2, src)
    (tmp_path / "link").symlink_to(src)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("keep")
    cases = [
        (src, src, "is the source folder"),
        (src, str(src) + "/", "is the source folder"),
        (src, tmp_path / "link", "is the source folder"),
        (src, taken, "already exists"),
        (src, tmp_path / "absent" / "out", "does not exist; create it first"),
        (tmp_path / "nowhere", tmp_path / "o1", "no such folder"),
        (src / "model.bin", tmp_path / "o2", "is a file"),
        (hf, tmp_path / "o3", "has no model.bin"),
    ]
    for s, d, message in cases:
        with pytest.raises(Error, match=message):
            tallow.convert(s, d)
    assert (taken / "x").read_text() == "keep"
    assert cli_main(["convert", str(src), str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tallow convert: error: ") and err.count("\n") == 1

    broken = tmp_path / "broken"
    shutil.copytree(ct2, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(FormatError, match=r"has no tokenizer\.json \(found vocabulary\.json\)"):
        tallow.convert(broken, tmp_path / "o4")
    (broken / "model.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(FormatError, match="is not a CTranslate2 model"):
        tallow.convert(broken, tmp_path / "o5")
    spec = b"TransformerDecoderSpec\0"  # a CTranslate2 language model, say
    (broken / "model.bin").write_bytes(struct.pack("<IH", 6, len(spec)) + spec + struct.pack("<II", 1, 0))
    (broken / "tokenizer.json").write_text("{}")
    with pytest.raises(FormatError, match="spec 'TransformerDecoderSpec'; tallow convert handles CTranslate2 Whisper"):
        tallow.convert(broken, tmp_path / "o6")
    with pytest.raises(FormatError, match="spec 'TransformerDecoderSpec', which tallow does not load"):
        tallow.load_model(broken)


def test_a_failed_conversion_leaves_nothing(built, tmp_path):
    _, _, ct2, _ = built
    src = tmp_path / "src"
    shutil.copytree(ct2, src)
    blob = (src / "model.bin").read_bytes()
    (src / "model.bin").write_bytes(blob[:-10])  # truncated: found while converting, after the temp folder exists
    out = tmp_path / "out"
    with pytest.raises(FormatError, match="file ends inside"):
        tallow.convert(src, out)
    assert not out.exists() and _leftovers(tmp_path) == []
    config = json.loads((ct2 / "config.json").read_text())
    (src / "model.bin").write_bytes(blob)
    (src / "config.json").write_text(json.dumps(dict(config, suppress_ids=[1, "two"])))
    with pytest.raises(FormatError, match="'suppress_ids' must be a list of token ids"):
        tallow.convert(src, out)
    assert not out.exists() and _leftovers(tmp_path) == []
    out.mkdir()  # an empty folder made beforehand is fine
    assert tallow.convert(ct2, out) == out and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("seed", [3, pytest.param(4, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)])
def test_tallow_detects_the_language_transformers_detects(models, seed):
    """tallow's own multilingual path on the converted folder: language detection picks
    the token transformers' detect_language picks (it needs the converted lang_to_id)."""
    from tallow.models.whisper_decoding import detect_language_from_features

    _, _, _, out = models("multilingual")
    feats = _features(seed)
    with torch.no_grad():
        reference = transformers.WhisperForConditionalGeneration.from_pretrained(str(out)).eval()
        expected = int(reference.detect_language(input_features=feats)[0])
    model = whisper.load(out, device="cpu")
    code, probs = detect_language_from_features(model, model.encode(tallow.tensor(feats.numpy())))
    assert len(probs) == 99 and abs(sum(probs.values()) - 1) < 1e-6
    assert model.tokens.languages[code] == expected
