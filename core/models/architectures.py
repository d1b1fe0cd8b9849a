"""The decoder architectures tallow runs, each registered by its own file in
models/decoders/ with one `register(Architecture(...))`: the class that implements
it, the config defaults its model_type implies, and how llama.cpp's GGUF files name
its tensors and settings. config.py, gguf_names.py and loader.py read only this
registry, so adding an architecture is one new file in models/decoders/ (or, from
user code, one register() call before load_model).

    register(Architecture("toy", ToyForCausalLM, gguf_arch="toy", gguf_blocks={...}))
"""
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..errors import Error, UnsupportedError

# llama.cpp's names of the tensors outside the blocks, and the Hugging Face names they stand for
GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class Architecture:
    """One decoder architecture.

    model_type       config.json's model_type (from GGUF: see gguf_arch)
    model_class      built as model_class(VarBuilder, DecoderConfig)
    config_defaults  config fields this model_type implies when a config leaves them out
                     (e.g. Qwen2's qkv_bias, Gemma 3's tie_word_embeddings); see config.py
    gguf_arch        GGUF general.architecture of these files (None: no GGUF support)
    gguf_blocks      llama.cpp per-block tensor name -> the Hugging Face name below
                     model.layers.N. (e.g. "attn_q" -> "self_attn.q_proj")
    gguf_top         the same for tensors outside the blocks
    gguf_config      (metadata Fields, config dict so far) -> more config entries, for
                     what llama.cpp fixes per architecture instead of storing it
    gguf_fused_qkv   llama.cpp block name of a fused q/k/v weight that is split by rows
                     into self_attn.q_proj/k_proj/v_proj (Phi-2's attn_qkv)
    """
    model_type: str
    model_class: type
    config_defaults: dict = field(default_factory=dict)
    gguf_arch: Optional[str] = None
    gguf_blocks: dict = field(default_factory=dict)
    gguf_top: dict = field(default_factory=lambda: dict(GGUF_TOP))
    gguf_config: Optional[Callable] = None
    gguf_fused_qkv: Optional[str] = None


_BY_MODEL_TYPE: dict[str, "Architecture"] = {}
_BY_GGUF_ARCH: dict[str, "Architecture"] = {}
_HINTS: dict[str, str] = {}  # model_type tallow refuses -> why, and what to use instead
_builtins_loaded = False


def register(arch):
    """Make an architecture loadable by load_model; returns it. A model_type or GGUF
    architecture that is already registered to another class is an Error."""
    if not isinstance(arch, Architecture):
        raise Error(f"register() takes an Architecture, not {type(arch).__name__}")
    for table, key in ((_BY_MODEL_TYPE, arch.model_type), (_BY_GGUF_ARCH, arch.gguf_arch)):
        if key is None:
            continue
        old = table.get(key)
        if old is not None and old != arch:
            raise Error(f"architecture {key!r} is already registered (to {old.model_class.__name__}); "
                        f"unregister({old.model_type!r}) first to replace it")
        table[key] = arch
    return arch


def unregister(model_type):
    """Forget a registered architecture (tests, and replacing a built-in one)."""
    arch = _BY_MODEL_TYPE.pop(model_type, None)
    if arch is not None and _BY_GGUF_ARCH.get(arch.gguf_arch) is arch:
        del _BY_GGUF_ARCH[arch.gguf_arch]


def refuse(model_type, why):
    """A model_type that is not supported on purpose, and what to use instead (in the error)."""
    _HINTS[model_type] = why


def _load_builtins():
    # Every module in models/decoders/ registers its architectures when imported.
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        package = f"{__package__}.decoders"
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{module.name}")


def known():
    """{model_type: Architecture} of everything registered."""
    _load_builtins()
    return dict(_BY_MODEL_TYPE)


def by_model_type(model_type, source):
    """The Architecture of a config's model_type; UnsupportedError naming the supported ones."""
    _load_builtins()
    if model_type not in _BY_MODEL_TYPE:
        hint = f" ({_HINTS[model_type]})" if model_type in _HINTS else ""
        raise UnsupportedError(f"{source}: model_type {model_type!r} is not supported{hint} "
                               f"(supported: {', '.join(sorted(_BY_MODEL_TYPE))}, whisper)")
    return _BY_MODEL_TYPE[model_type]


def by_gguf_arch(gguf_arch, source):
    """The Architecture of a GGUF's general.architecture; UnsupportedError naming the supported ones."""
    _load_builtins()
    if not isinstance(gguf_arch, str) or gguf_arch not in _BY_GGUF_ARCH:
        raise UnsupportedError(f"{source}: GGUF architecture {gguf_arch!r} is not supported "
                               f"(supported: {', '.join(sorted(_BY_GGUF_ARCH))})")
    return _BY_GGUF_ARCH[gguf_arch]


def config_defaults(model_type):
    """The config fields a model_type implies (empty for one not registered: the config says all)."""
    _load_builtins()
    arch = _BY_MODEL_TYPE.get(model_type)
    return {} if arch is None else arch.config_defaults
