"""tallow.load_model: a known name, a Hugging Face-layout directory or a GGUF
file -> a ready model (with its tokenizer), dispatching on the config's
model_type or the GGUF's general.architecture through the registry
(architectures.py): nothing here names an architecture but Whisper, which is
not a decoder-only model and has its own loader.

    model = tallow.load_model("smollm2-135m-instruct")          # fetched once into the cache
    model = tallow.load_model("path/to/hf_dir", device="python")
    model = tallow.load_model("model.Q8_0.gguf")
"""
import os

from ..config_fields import Fields
from ..device import Device, default_device
from ..errors import Error, FormatError
from ..json_file import read_json
from .architectures import by_model_type
from .config import DecoderConfig


def _resolve(name_or_path):
    path = os.fspath(name_or_path)
    if os.path.exists(path):
        return path
    from .. import hub
    try:
        return os.fspath(hub.fetch(path))
    except Error as e:
        raise Error(f"cannot load model {path!r}: it is not a local directory or .gguf file, and fetching it "
                    f"failed: {e}") from None


def _build(cls, weights, cfg, device, dtype):
    from ..nn import VarBuilder
    return cls(VarBuilder(weights, device, dtype), cfg)


def load_directory(path, device=None, dtype=None, weights=None):
    """A decoder from config.json + *.safetensors (sharded too) + tokenizer.json. weights: an
    opened reader to use instead of the folder's safetensors (in the browser: files read in slices)."""
    from .. import io
    config_path = os.path.join(path, "config.json")
    raw = read_json(config_path)
    if not isinstance(raw, dict):
        raise FormatError(f"{config_path}: a config must be a JSON object")
    model_type = raw.get("model_type")
    if model_type == "whisper":
        from . import whisper
        return whisper.load(path, device=device, dtype=dtype, weights=weights)
    cfg = DecoderConfig(raw, source=config_path)
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.exists(gen_path):  # chat models list their end-of-turn ids here
        gen = read_json(gen_path)
        if not isinstance(gen, dict):
            raise FormatError(f"{gen_path}: a generation config must be a JSON object")
        for tid in Fields(gen, gen_path).token_ids("eos_token_id", cfg.vocab_size):
            if tid not in cfg.eos_token_ids:
                cfg.eos_token_ids.append(tid)
    model = _build(by_model_type(model_type, path).model_class, io.open(path) if weights is None else weights, cfg,
                   device, dtype)
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        from ..tokenizer import Tokenizer
        model.tokenizer = Tokenizer.from_file(path)
    return model


def load_gguf(path, device=None, dtype=None):
    """A decoder from a llama.cpp GGUF file; the tokenizer comes from its metadata."""
    from .. import io
    from ..backends.cpu.runtime.kernel_calls import load_ahead
    from .gguf_names import GGUFWeights, config_from_gguf
    reader = io.open(path, format="gguf")
    arch, raw = config_from_gguf(reader)
    cfg = DecoderConfig(raw, source=path)
    load_ahead(default_device() if device is None else Device(device))  # (a cold CPU compiles here, saying so)
    model = _build(arch.model_class, GGUFWeights(reader, raw, arch), cfg, device, dtype)
    if "tokenizer.ggml.model" in reader.metadata:  # checked now, built on first use (CausalLM.tokenizer)
        from ..tokenizer import Tokenizer
        model.tokenizer_on_first_use(Tokenizer.gguf_builder(reader))
    return model


def load_model(name_or_path, device=None, dtype=None):
    """A model from a known name (fetched on first use, see `tallow fetch --list`), a
    Hugging Face-layout directory or a .gguf file. device: "cpu", "python", "wgpu"...
    dtype: what float weights become (default f32); quantised GGUF weights stay quantised."""
    path = _resolve(name_or_path)
    device = default_device() if device is None else Device(device)
    if os.path.isdir(path):
        from ..io.ctranslate2_convert import is_ctranslate2_dir, not_converted_error
        if is_ctranslate2_dir(path):  # a faster-whisper folder: its config.json is not a model config
            raise not_converted_error(path)
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FormatError(f"{path}: a model directory needs a config.json (Hugging Face layout)")
        return load_directory(path, device, dtype)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return load_gguf(path, device, dtype)
    from ..io.ctranslate2_convert import is_ctranslate2_model, not_converted_error
    if is_ctranslate2_model(path):  # the model.bin of a faster-whisper folder
        raise not_converted_error(path)
    raise FormatError(f"{path}: not a model directory or a GGUF file (starts with {magic!r})")
