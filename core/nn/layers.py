"""The layers: thin holders of weights whose forward is one functional op."""
from .. import functional as F
from .. import ops


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

    def add_norm(self, x, residual, norm, act=None):
        """(hidden, self(norm(hidden))) with hidden = x + residual (x when residual is None), then
        act (a unary op name) if given: the residual add, the norm module (LayerNorm or RMSNorm)
        and this layer as one op (functional.add_norm_linear)."""
        return F.add_norm_linear(x, residual, norm.weight, norm.bias, self.weight, self.bias, norm.kind, norm.eps, act)


class FusedLinear(Module):
    """Linear layers over one input (q/k/v, gate/up) as one matmul: their weight rows and
    biases joined at load time (VarBuilder.get_rows), the outputs column ranges of the result.
    Parts that cannot join (block formats that differ) stay separate Linears, same results.

        qkv = FusedLinear(vb, ["q_proj", "k_proj", "v_proj"], 576, [576, 192, 192], bias=False)
        q, k, v = qkv.parts(x)            # views of one (..., 960) output
    """

    def __init__(self, vb, names, in_features, sizes, bias=True):
        """bias: True/False for every part, or one flag per part (a part without one adds zeros)."""
        self.sizes = list(sizes)
        biases = list(bias) if isinstance(bias, (list, tuple)) else [bias] * len(names)
        self.weight = vb.get_rows([((n, in_features), f"{name}.weight") for name, n in zip(names, sizes)])
        self.bias = None
        self.separate = None
        if self.weight is None:
            self.separate = [Linear(vb.pp(name), in_features, n, b) for name, n, b in zip(names, sizes, biases)]
        elif any(biases):
            self.bias = vb.get_rows([((n,), f"{name}.bias" if b else None) for name, n, b in zip(names, sizes, biases)])

    def forward(self, x):
        """The parts' outputs side by side: (..., sum(sizes))."""
        if self.separate is not None:
            return F.cat([part(x) for part in self.separate], -1)
        return F.linear(x, self.weight, self.bias)

    def parts(self, x):
        """Each part's output (views of one matmul's result when joined)."""
        if self.separate is not None:
            return [part(x) for part in self.separate]
        return self._split(F.linear(x, self.weight, self.bias))

    def _split(self, y):
        out, start = [], 0
        for n in self.sizes:
            out.append(y.narrow(-1, start, n))
            start += n
        return out

    def add_norm_parts(self, x, residual, norm):
        """(hidden, parts(norm(hidden))) with hidden = x + residual (x when residual is None): the
        residual add, the norm module and the joined projection as one op where the rows joined."""
        if self.separate is not None:
            if residual is None:
                # The first block (no residual add to fuse the norm into): each part's own norm +
                # product op, the norm of a row repeated per part, so a decoding step stays one
                # recordable program on the CPU (a lone norm is not recorded there). A Q4_K_M
                # file's first layers never join q/k/v: attn_v is Q6_K there, q and k Q4_K.
                outs = [F.add_norm_linear(x, None, norm.weight, norm.bias, p.weight, p.bias, norm.kind, norm.eps)
                        for p in self.separate]
                return outs[0][0], [y for _, y in outs]
            hidden, normed = _add_norm(x, residual, norm)
            return hidden, self.parts(normed)
        hidden, y = F.add_norm_linear(x, residual, norm.weight, norm.bias, self.weight, self.bias, norm.kind,
                                      norm.eps)
        return hidden, self._split(y)

    def add_norm_heads(self, x, residual, norm, head_dim):
        """add_norm_parts with each part (b, t, heads * head_dim) as attention heads (b, heads, t,
        head_dim). Joined: one reshape and transpose of the one output, then a head range per part
        (the same views as splitting each part: 5 view ops instead of 9 for q/k/v)."""
        if self.separate is not None:
            hidden, parts = self.add_norm_parts(x, residual, norm)
            return hidden, [p.reshape(p.shape[:-1] + (p.shape[-1] // head_dim, head_dim)).transpose(-3, -2)
                            for p in parts]
        hidden, y = F.add_norm_linear(x, residual, norm.weight, norm.bias, self.weight, self.bias, norm.kind,
                                      norm.eps)
        b, t, n = y.shape
        y = y.reshape(b, t, n // head_dim, head_dim).transpose(1, 2)
        out, start = [], 0
        for size in self.sizes:
            out.append(y.narrow(1, start, size // head_dim))
            start += size // head_dim
        return hidden, out

    def add_norm_gated(self, x, residual, norm, act):
        """(hidden, gated(norm(hidden), act)) as one op where gated is one (rows joined, no bias)."""
        if self.separate is None and self.bias is None:
            return F.add_norm_linear(x, residual, norm.weight, norm.bias, self.weight, None, norm.kind, norm.eps, act,
                                     gated=True)
        hidden, normed = _add_norm(x, residual, norm)
        return hidden, self.gated(normed, act)

    def gated(self, x, act):
        """act(gate(x)) * up(x) for two parts [gate, up]; one fused op when the rows joined
        and there is no bias. act: a unary op name (silu, gelu, gelu_tanh, relu)."""
        if self.separate is None and self.bias is None:
            return F.gated_linear(x, self.weight, act)
        gate, up = self.parts(x)
        return ops.unary(gate, act) * up


class Embedding(Module):
    def __init__(self, vb, num_embeddings, dim):
        self.weight = vb.get((num_embeddings, dim), "weight")

    def forward(self, ids):
        return F.embedding(ids, self.weight)


def _add_norm(x, residual, norm):
    """(x + residual, norm(x + residual)) as one op; residual None: (x, norm(x))."""
    if residual is None:
        return x, norm(x)
    if norm.kind == "layer":
        return F.add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps)
    return F.add_rms_norm(x, residual, norm.weight, norm.eps)


class LayerNorm(Module):
    kind = "layer"  # for functional.add_norm_linear

    def __init__(self, vb, dim, eps=1e-5, bias=True):
        self.weight = vb.get((dim,), "weight")
        self.bias = vb.get((dim,), "bias") if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    kind = "rms"  # for functional.add_norm_linear
    bias = None

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
