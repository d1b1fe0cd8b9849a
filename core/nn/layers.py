"""The layers: thin holders of weights whose forward is one functional op."""
from .. import functional as F


class Module:
    """Base class: sub-modules and weights are plain attributes (lists of modules allowed)."""

    def named_parameters(self, prefix=""):
        from ..tensor import Tensor
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                yield prefix + name, value
            elif isinstance(value, Module):
                yield from value.named_parameters(f"{prefix}{name}.")
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield from item.named_parameters(f"{prefix}{name}.{i}.")

    def state_dict(self):
        return dict(self.named_parameters())

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Linear(Module):
    def __init__(self, vb, in_features, out_features, bias=True):
        self.weight = vb.get((out_features, in_features), "weight")
        self.bias = vb.get((out_features,), "bias") if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    def __init__(self, vb, num_embeddings, dim):
        self.weight = vb.get((num_embeddings, dim), "weight")

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class LayerNorm(Module):
    def __init__(self, vb, dim, eps=1e-5, bias=True):
        self.weight = vb.get((dim,), "weight")
        self.bias = vb.get((dim,), "bias") if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, vb, dim, eps=1e-6):
        self.weight = vb.get((dim,), "weight")
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)


class Conv1d(Module):
    def __init__(self, vb, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        self.weight = vb.get((out_channels, in_channels // groups, kernel_size), "weight")
        self.bias = vb.get((out_channels,), "bias") if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
