"""`tallow convert SRC DST` / tallow.convert(src, dst): a CTranslate2 Whisper model
(a faster-whisper folder: model.bin, config.json, tokenizer.json, optional
preprocessor_config.json and vocabulary.*) into the Hugging Face layout tallow
and transformers load: config.json, generation_config.json, model.safetensors,
preprocessor_config.json, tokenizer.json.

DST appears whole or not at all: the files are written into a temporary folder
next to it, which is renamed to DST at the end. DST must not exist yet (an empty
folder is fine), and cannot be SRC. Weights keep their stored dtype (f16 for
faster-whisper's models, bf16, f32); int8/int16-quantised ones are dequantised
to the model's float dtype. Native only (needs numpy).
"""
import json
import os
import secrets
import shlex
import shutil
from pathlib import Path

from ..errors import Error, FormatError
from .atomic_output import atomic_output, same_file
from .ctranslate2 import ctranslate2_spec, is_ctranslate2_model

# What a faster-whisper folder may hold besides model.bin; only tokenizer.json is needed.
TOKENIZER_FILES = ("tokenizer.json", "vocabulary.json", "vocabulary.txt")


def is_ctranslate2_dir(path):
    """True when `path` is a folder holding a CTranslate2 model.bin (checked by its header)."""
    path = Path(os.fspath(path))
    return path.is_dir() and is_ctranslate2_model(path / "model.bin")


def not_converted_error(path):
    """The error for a CTranslate2 folder (or its model.bin) given where a Hugging Face-layout
    model is needed: what it is, and the exact command that converts it."""
    path = os.fspath(path)
    model_bin = path if os.path.isfile(path) else os.path.join(path, "model.bin")
    folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path.rstrip("/\\") or path
    spec = ctranslate2_spec(model_bin)
    if spec != "WhisperSpec":
        return FormatError(f"{folder}: is a CTranslate2 model of spec {spec!r}, which tallow does not load; "
                           "tallow convert handles CTranslate2 Whisper models (WhisperSpec) only")
    target = folder + "-hf"
    return FormatError(f"{folder}: is a CTranslate2 (faster-whisper) model (model.bin), which tallow does not load "
                       f"directly; convert it once with `tallow convert {shlex.quote(folder)} {shlex.quote(target)}` "
                       f"(Python: tallow.convert(src, dst)) and load {target}")


def convert(src, dst, progress=False):
    """Convert the CTranslate2 Whisper folder `src` into a new Hugging Face-layout folder
    `dst`; returns dst as a Path. progress: say what is happening on stderr."""
    src, dst = Path(os.fspath(src)), Path(os.fspath(dst))
    _check_source(src)
    _check_destination(src, dst)
    tokenizer = _read_json(src / "tokenizer.json")
    ct2_config = _read_json(src / "config.json") if (src / "config.json").is_file() else {}
    target = Path(os.path.abspath(dst))  # "out/", "./out": the temp folder goes next to the real name
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _write_hf_folder(src, tmp, tokenizer, ct2_config, progress)
        if target.is_dir():
            target.rmdir()  # the empty folder the caller made (a rename over a folder fails on Windows)
        os.replace(tmp, target)  # DST is whole or absent
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _check_source(src):
    if not src.exists():
        raise Error(f"{src}: no such folder; give a CTranslate2 (faster-whisper) model folder")
    if not src.is_dir():
        raise Error(f"{src}: is a file; give the CTranslate2 model folder that holds model.bin")
    if not (src / "model.bin").is_file():
        raise FormatError(f"{src}: has no model.bin; tallow convert reads CTranslate2 (faster-whisper) model folders")
    spec = ctranslate2_spec(src / "model.bin")
    if spec is None:
        raise FormatError(f"{src / 'model.bin'}: is not a CTranslate2 model (its header does not match)")
    if spec != "WhisperSpec":
        raise FormatError(f"{src / 'model.bin'}: is a CTranslate2 model of spec {spec!r}; tallow convert handles "
                          "CTranslate2 Whisper models (WhisperSpec) only")
    if not (src / "tokenizer.json").is_file():
        present = [n for n in TOKENIZER_FILES if (src / n).is_file()]
        raise FormatError(f"{src}: has no tokenizer.json (found {', '.join(present) or 'no tokenizer file'}); "
                          "the converter needs the tokenizer.json that faster-whisper model folders ship: copy it "
                          "from the model's source (e.g. the openai/whisper-* repository) into this folder")


def _check_destination(src, dst):
    if same_file(src, dst):
        raise Error(f"{dst}: is the source folder {src}; write the converted model to a different folder")
    if dst.exists() and not (dst.is_dir() and not any(dst.iterdir())):
        raise Error(f"{dst}: already exists; remove it or choose a new folder for the converted model")
    parent = Path(os.path.abspath(dst)).parent
    if not parent.is_dir():
        raise Error(f"{dst}: the folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise Error(f"{dst}: cannot write in {parent} (permission denied); choose another folder")


def _read_json(path):
    from ..json_file import read_json
    value = read_json(path)
    if not isinstance(value, dict):
        raise FormatError(f"{path}: expected a JSON object")
    return value


def _write_json(path, value):
    with atomic_output(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=2) + "\n")


def _write_hf_folder(src, out, tokenizer, ct2_config, progress):
    from .ctranslate2 import load_ctranslate2
    from .ctranslate2_whisper import PREPROCESSOR_CONFIG, whisper_config, whisper_generation_config, \
        whisper_state_dict
    from .safetensors import write_safetensors

    _say(progress, f"converting {src / 'model.bin'} (CTranslate2) to Hugging Face layout")
    with load_ctranslate2(src / "model.bin") as ct2:
        state = whisper_state_dict(ct2)  # views into the mapped file: written before it closes
        config = whisper_config(ct2, tokenizer, ct2_config, src / "tokenizer.json", src / "config.json")
        write_safetensors(out / "model.safetensors", state, metadata={"format": "pt"})
        del state
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", whisper_generation_config(
        config, tokenizer, ct2_config, src / "tokenizer.json", src / "config.json"))
    preprocessor = src / "preprocessor_config.json"
    if preprocessor.is_file():  # large-v3's says 128 mel bins: keep the model's own
        _copy(preprocessor, out / "preprocessor_config.json")
    else:
        _write_json(out / "preprocessor_config.json", dict(PREPROCESSOR_CONFIG, feature_size=config["num_mel_bins"]))
    _copy(src / "tokenizer.json", out / "tokenizer.json")
    _say(progress, f"wrote {len(list(out.iterdir()))} files")


def _copy(source, target):
    with open(source, "rb") as fin, atomic_output(target) as fout:
        shutil.copyfileobj(fin, fout)


def _say(progress, message):
    if progress:
        import sys
        print(f"tallow: {message}", file=sys.stderr, flush=True)

