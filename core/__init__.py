"""tallow: a minimalist ML framework for inference in the browser and on edge boxes.

This module is the facade, the top of the layers (tests/test_layers.py): it imports
the tensor core now and the rest on first use (tallow.load_model, tallow.convert,
tallow.Tokenizer, tallow.hub, tallow.generation, ...). No module of a lower layer imports it:
inside the package, import from the module that defines a name.
"""
from .version import __version__  # noqa: F401

from . import dtypes, functional  # noqa: F401
from .autograd import enable_grad, is_grad_enabled, no_grad  # noqa: F401
from .custom_op import CustomOp, custom_op  # noqa: F401
from .creation import (  # noqa: F401
    arange, empty, eye, from_buffer, from_numpy, full, full_like, linspace, manual_seed, ones, ones_like, rand,
    randint, randn, tensor, zeros, zeros_like,
)
from .device import Device, default_device, devices, set_default_device  # noqa: F401
from .dtypes import bf16, bool_, f16, f32, f64, i8, i32, i64, u8, u32, DType, get_dtype, promote  # noqa: F401
from .errors import (  # noqa: F401
    ChatTemplateError, ContextWindowError, DeviceError, DTypeError, Error, FormatError, IndexRangeError, ShapeError,
    UnsupportedError, ValueRangeError,
)
from .functional import (  # noqa: F401
    cat, chunk, pad, split, stack, where, conv1d, conv2d, gelu, layer_norm, linear, log_softmax, relu, rms_norm,
    rotary_emb, scaled_dot_product_attention,
    sigmoid, silu, softmax,
)
from .tensor import Tensor  # noqa: F401
from .step_capture import Graph, can_capture, capture  # noqa: F401


def __getattr__(name):
    # Heavier parts load on first use so `import tallow` stays fast (Pyodide).
    import importlib
    lazy = {"io": ".io", "quant": ".quant", "nn": ".nn", "audio": ".audio", "models": ".models", "hub": ".hub",
            "generation": ".generation"}
    if name in lazy:
        return importlib.import_module(lazy[name], __name__)
    if name == "Tokenizer":
        from .tokenizer import Tokenizer
        return Tokenizer
    if name == "convert":
        from .io.ctranslate2_convert import convert
        return convert
    if name == "load_model":
        from .models import load_model
        return load_model
    raise AttributeError(f"module 'tallow' has no attribute {name!r}")
