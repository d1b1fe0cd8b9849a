"""Neural-network ops over tensors (tallow.functional, also tallow.nn.functional).

Each checks shapes, then calls one fused backend primitive where fusing pays.
"""
import math

from . import dtypes as D
from . import grad_rules as G
from .autograd import needs_grad
from .creation import as_index, full, pad  # noqa: F401  (pad is part of this API)
from .errors import DeviceError, DTypeError, ShapeError
from .index_check import check_ids
from .layout import Layout
from .tensor import Tensor, _dim


def _float(x, op):
    if x.dtype.is_quantized:
        raise DTypeError(f"{op}: quantised input; dequantise it first with .to(tallow.f32)")
    return x if x.dtype.is_float else x.to(D.f32)


def _parts(t):
    return (None, None) if t is None else (t._storage, t._layout)


def _check_device(op, *ts):
    dev = ts[0].device
    for t in ts[1:]:
        if t is not None and t.device is not dev:
            raise DeviceError(f"{op}: tensors are on {dev} and {t.device}")


def _last_dim_op(x, dim, fn):
    dim = _dim(dim, x.ndim, "softmax")
    if dim == x.ndim - 1:
        return fn(x)
    return fn(x.transpose(dim, -1)).transpose(dim, -1)


def _softmax_last(t, log):
    out = t._new(t.device.backend.softmax(t._storage, t._layout, t.dtype, log=log), t.shape)
    return t._record(out, (t,), lambda: G.softmax(out, log))


def softmax(x, dim=-1):
    x = _float(x, "softmax")
    if x.ndim == 0:
        return full((), 1.0, x.dtype, x.device)
    return _last_dim_op(x, dim, lambda t: _softmax_last(t, False))


def log_softmax(x, dim=-1):
    x = _float(x, "log_softmax")
    return _last_dim_op(x, dim, lambda t: _softmax_last(t, True))


def _check_affine(op, x, *params):
    for p in params:
        if p is not None and p.shape != (x.shape[-1],):
            raise ShapeError(f"{op}: weight/bias of shape {p.shape} does not match the last dim of input {x.shape}")


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Normalise over the last dim (mean 0, variance 1), then scale and shift."""
    x = _float(x, "layer_norm")
    _check_affine("layer_norm", x, weight, bias)
    _check_device("layer_norm", x, weight, bias)
    w = weight.to(x.dtype) if weight is not None else None
    b = bias.to(x.dtype) if bias is not None else None
    if needs_grad(x, w, b):  # the composite form differentiates through primitive ops
        c = x - x.mean(-1, keepdim=True)
        y = c * ((c * c).mean(-1, keepdim=True) + eps).rsqrt()
        y = y * w if w is not None else y
        return y + b if b is not None else y
    st = x.device.backend.layer_norm(x._storage, x._layout, *_parts(w), *_parts(b), x.dtype, eps)
    return x._new(st, x.shape)


def rms_norm(x, weight=None, eps=1e-6):
    x = _float(x, "rms_norm")
    _check_affine("rms_norm", x, weight)
    _check_device("rms_norm", x, weight)
    w = weight.to(x.dtype) if weight is not None else None
    if needs_grad(x, w):
        y = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
        return y * w if w is not None else y
    return x._new(x.device.backend.rms_norm(x._storage, x._layout, *_parts(w), x.dtype, eps), x.shape)


def linear(x, weight, bias=None):
    """x @ weight.T + bias; a quantised weight is dequantised inside the backend's kernel."""
    if x.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"linear: input {x.shape} has {x.shape[-1]} features, weight {weight.shape} expects {weight.shape[-1]}")
    y = x @ weight.t()
    return y if bias is None else y + bias


def embedding(ids, table):
    ids = as_index(ids, table.device, "embedding")
    check_ids(ids, table.shape[0], "embedding", 0, "id")  # named here: a negative token id is a caller's bug
    rows = table.index_select(0, ids.reshape(-1))
    return rows.reshape(ids.shape + (table.shape[-1],))


def gelu(x, approximate="none"):
    return x.gelu(approximate)


def silu(x):
    return x.silu()


def relu(x):
    return x.relu()


def sigmoid(x):
    return x.sigmoid()


def tanh(x):
    return x.tanh()


def _conv(op, x, w, b, stride, padding, dilation, groups, nd):
    x, w = _float(x, op), _float(w, op)
    _check_device(op, x, w, b)
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise ShapeError(f"{op}: input {x.shape} and weight {w.shape} must both have {nd + 2} dims")
    cin, cout = x.shape[1], w.shape[0]
    if cin % groups or cout % groups or w.shape[1] * groups != cin:
        raise ShapeError(f"{op}: input channels {cin}, weight {w.shape} and groups={groups} do not fit "
                         f"(weight dim 1 must be in_channels / groups = {cin // max(groups, 1)})")
    dtype = D.promote(x.dtype, w.dtype)
    x, w = x.to(dtype), w.to(dtype)
    pair = (lambda v: (v,) * nd if isinstance(v, int) else tuple(v))
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    outs = []
    for i in range(nd):
        n = (x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
        if n <= 0:
            raise ShapeError(f"{op}: input {x.shape} is too small for kernel {w.shape[2:]} with padding {padding}, dilation {dilation}")
        outs.append(n)
    if needs_grad(x, w):
        y = _conv_composite(x, w, stride, padding, dilation, groups, outs)
        return y if b is None else y + b.to(dtype).reshape((1, cout) + (1,) * nd)
    be = x.device.backend
    if nd == 1:
        st = be.conv1d(x._storage, x._layout, w._storage, w._layout, dtype, stride[0], padding[0], dilation[0], groups)
    else:
        st = be.conv2d(x._storage, x._layout, w._storage, w._layout, dtype, stride, padding, dilation, groups)
    y = x._new(st, (x.shape[0], cout, *outs), dtype)
    if b is not None:
        y = y + b.to(dtype).reshape((1, cout) + (1,) * nd)
    return y


def _conv_composite(x, w, stride, padding, dilation, groups, outs):
    """Convolution as strided views + one matmul per group (differentiable through primitives)."""
    from .creation import cat, stack
    nd = len(stride)
    pads = []
    for p in reversed(padding):
        pads += [p, p]
    xp = pad(x, tuple(pads)) if any(padding) else x
    ks = w.shape[2:]
    cols = []
    for kidx in _product([range(k) for k in ks]):
        key = (slice(None), slice(None)) + tuple(
            slice(kidx[i] * dilation[i], kidx[i] * dilation[i] + stride[i] * (outs[i] - 1) + 1, stride[i]) for i in range(nd))
        cols.append(xp[key])  # (b, cin, *outs)
    col = stack(cols, -1)  # (b, cin, *outs, K)
    b, cin = x.shape[:2]
    cout, cin_g = w.shape[:2]
    K = len(cols)
    n_out = 1
    for o in outs:
        n_out *= o
    col = col.reshape(b, groups, cin_g, n_out, K).permute(0, 1, 3, 2, 4).reshape(b, groups, n_out, cin_g * K)
    wg = w.reshape(groups, cout // groups, cin_g * K)
    y = col @ wg.unsqueeze(0).transpose(-1, -2)  # (b, groups, n_out, cout/groups)
    return y.permute(0, 1, 3, 2).reshape((b, cout) + tuple(outs))


def _product(ranges):
    out = [()]
    for r in ranges:
        out = [p + (i,) for p in out for i in r]
    return out


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv1d", x, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv2d", x, weight, bias, stride, padding, dilation, groups, 2)


def rotary_emb(x, cos, sin, interleaved=False):
    """Rotary position embedding. x (b, h, t, d); cos and sin (t, d/2).
    interleaved=False is the half-split (GPT-NeoX / Llama HF) form, True the GPT-J form."""
    x = _float(x, "rotary_emb")
    _check_device("rotary_emb", x, cos, sin)
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ShapeError(f"rotary_emb: x must be (batch, heads, seq, even head_dim), got {x.shape}")
    want = (x.shape[2], x.shape[3] // 2)
    if cos.shape != want or sin.shape != want:
        raise ShapeError(f"rotary_emb: cos/sin must have shape {want} for x {x.shape}, got {cos.shape} and {sin.shape}")
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if needs_grad(x, c, s):
        from .creation import cat, stack
        h = x.shape[-1] // 2
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(x.shape)
        x1, x2 = x.narrow(-1, 0, h), x.narrow(-1, h, h)
        return cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)
    st = x.device.backend.rope(x._storage, x._layout, c._storage, c._layout, s._storage, s._layout, x.dtype, interleaved)
    return x._new(st, x.shape)


def repeat_kv(x, n_rep):
    """(b, hk, t, d) -> (b, hk * n_rep, t, d) for grouped-query attention."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x.unsqueeze(2).expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def scaled_dot_product_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v. q (b, h, tq, d), k/v (b, hk, tk, d) with h a multiple of hk (GQA).
    mask: additive float, or bool where True means "may attend" (as in torch); broadcast to (b, h, tq, tk)."""
    q, k, v = _float(q, "attention"), _float(k, "attention"), _float(v, "attention")
    _check_device("attention", q, k, v, mask)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeError(f"attention: q, k, v must be (batch, heads, seq, head_dim), got {q.shape}, {k.shape}, {v.shape}")
    b, h, tq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or v.shape[:3] != k.shape[:3] or h % k.shape[1]:
        raise ShapeError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    hk = k.shape[1]
    n_rep = h // hk
    if n_rep > 1 and (tq == 1 or not is_causal) and mask is None and not needs_grad(q, k, v):
        # Grouped-query attention without copying K/V: the n_rep query heads that share a
        # KV head become extra query rows (a one-token causal step masks nothing).
        out = scaled_dot_product_attention(q.reshape(b, hk, n_rep * tq, d), k, v, scale=scale)
        return out.reshape(b, h, tq, v.shape[3])
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    dtype = q.dtype
    k, v = k.to(dtype), v.to(dtype)
    tk = k.shape[2]
    lmask = None
    if mask is not None:
        if mask.dtype is D.bool_:
            mask = full((), 0.0, dtype, q.device).where(mask, float("-inf"))
        mask = mask.to(dtype)
        lmask = mask._layout.broadcast_to((b, h, tq, tk), "attention mask")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if needs_grad(q, k, v, mask):
        scores = (q @ k.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores + mask
        if is_causal:
            from .creation import arange
            banned = arange(tk, device=q.device).unsqueeze(0) > (arange(tq, device=q.device).unsqueeze(1) + (tk - tq))
            scores = scores.masked_fill(banned, float("-inf"))
        return softmax(scores, -1) @ v
    st = q.device.backend.attention(q._storage, q._layout, k._storage, k._layout, v._storage, v._layout,
                                    None if mask is None else mask._storage, lmask, dtype, scale, is_causal)
    return Tensor(st, Layout((b, h, tq, v.shape[3])), dtype, q.device)


def cross_entropy(logits, targets):
    """Mean negative log-likelihood of integer class targets under softmax(logits); logits (n, classes)."""
    if logits.ndim != 2 or targets.shape != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: logits must be (n, classes) and targets (n,), got {logits.shape} and {targets.shape}")
    picked = log_softmax(logits, -1).gather(1, as_index(targets, logits.device, "cross_entropy").unsqueeze(1))
    return -picked.mean()


def mse_loss(pred, target):
    return (pred - target).square().mean()
