"""tallow.nn: layers, the weight builder, KV cache and rotary embeddings."""
from .. import functional  # noqa: F401  (tallow.nn.functional)
from .kv_cache import KVCache  # noqa: F401
from .parameter import Parameter, VarMap  # noqa: F401
from .layers import Conv1d, Embedding, FusedLinear, LayerNorm, Linear, Module, RMSNorm  # noqa: F401
from .rotary import RotaryEmbedding, inv_frequencies  # noqa: F401
from .var_builder import VarBuilder  # noqa: F401
