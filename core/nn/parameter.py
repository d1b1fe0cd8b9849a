"""Trainable parameters and the store that creates them (Candle's VarMap)."""
import math

from ..creation import rand, zeros
from ..tensor import Tensor


class Parameter(Tensor):
    """A tensor that requires grad; optimisers update it in place."""

    __slots__ = ()

    def __init__(self, data):
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter wraps a tallow.Tensor, got {type(data).__name__}")
        t = data.detach().contiguous()
        super().__init__(t._storage, t._layout, t.dtype, t.device)
        self.requires_grad_()


class VarMap:
    """A weights source for VarBuilder that creates missing parameters with an initialiser,
    so the same model code trains from scratch or loads a checkpoint."""

    def __init__(self):
        self.vars = {}

    def keys(self):
        return self.vars.keys()

    def __contains__(self, name):
        return name in self.vars

    def get_or_create(self, name, shape, device, dtype, init="kaiming"):
        if name not in self.vars:
            if init == "zeros" or len(shape) == 1:
                t = zeros(*shape, dtype=dtype, device=device)
            else:  # Kaiming-uniform over fan-in, as torch.nn.Linear/Conv initialise
                fan_in = math.prod(shape[1:])
                bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
                t = rand(*shape, dtype=dtype, device=device) * (2 * bound) - bound
            self.vars[name] = Parameter(t)
        return self.vars[name]

    def parameters(self):
        return list(self.vars.values())

    def save(self, path):
        from ..io import save_file
        save_file(dict(self.vars), path)

    def load(self, path):
        """Copy values from a safetensors file into the existing parameters (by name)."""
        from ..errors import FormatError, ShapeError
        from ..io import load_file
        loaded = load_file(path)
        for name, p in self.vars.items():
            if name not in loaded:
                raise FormatError(f"{path}: has no tensor {name!r}")
            t = loaded[name]
            if t.shape != p.shape:
                raise ShapeError(f"{path}: {name!r} has shape {t.shape}, the parameter {p.shape}")
            p[...] = t.to(p.device).to(p.dtype)
