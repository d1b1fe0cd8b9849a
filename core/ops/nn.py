"""Fused neural-network ops: layer_norm, rms_norm, rotary embedding, attention,
convolution, and user-defined custom ops.

Each checks its arguments, then calls one fused backend primitive. When a gradient
must be recorded it computes the same result from differentiable primitive ops
instead (the fused kernels have no backward).
"""
import math

from .. import dtypes as D
from ..autograd import _Mode, needs_grad, record
from ..backends.operand import Operand, Rotary, operand_of
from ..backends.specs import AttentionSpec, ConvSpec
from ..errors import ShapeError
from .arguments import check_devices, float_input
from .new import new_arange, new_full
from .shape import cat, pad, stack


def _check_affine(op, x, *params):
    for p in params:
        if p is not None and p.shape != (x.shape[-1],):
            raise ShapeError(f"{op}: weight/bias of shape {p.shape} does not match the last dim of input {x.shape}")


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Normalise over the last dim (mean 0, variance 1), then scale and shift."""
    x = float_input(x, "layer_norm")
    _check_affine("layer_norm", x, weight, bias)
    check_devices("layer_norm", x, weight, bias)
    w = weight.to(x.dtype) if weight is not None else None
    b = bias.to(x.dtype) if bias is not None else None
    if needs_grad(x, w, b):
        c = x - x.mean(-1, keepdim=True)
        y = c * ((c * c).mean(-1, keepdim=True) + eps).rsqrt()
        y = y * w if w is not None else y
        return y + b if b is not None else y
    return x._new(x.device.backend.layer_norm(operand_of(x), operand_of(w), operand_of(b), x.dtype, eps), x.shape)


def rms_norm(x, weight=None, eps=1e-6):
    x = float_input(x, "rms_norm")
    _check_affine("rms_norm", x, weight)
    check_devices("rms_norm", x, weight)
    w = weight.to(x.dtype) if weight is not None else None
    if needs_grad(x, w):
        y = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
        return y * w if w is not None else y
    return x._new(x.device.backend.rms_norm(operand_of(x), operand_of(w), x.dtype, eps), x.shape)


def rotary_emb(x, cos, sin, interleaved=False):
    """Rotary position embedding. x (b, h, t, d); cos and sin (t, d/2).
    interleaved=False is the half-split (GPT-NeoX / Llama HF) form, True the GPT-J form."""
    x = float_input(x, "rotary_emb")
    check_devices("rotary_emb", x, cos, sin)
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ShapeError(f"rotary_emb: x must be (batch, heads, seq, even head_dim), got {x.shape}")
    want = (x.shape[2], x.shape[3] // 2)
    if cos.shape != want or sin.shape != want:
        raise ShapeError(f"rotary_emb: cos/sin must have shape {want} for x {x.shape}, got {cos.shape} and {sin.shape}")
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if needs_grad(x, c, s):
        h = x.shape[-1] // 2
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(x.shape)
        x1, x2 = x.narrow(-1, 0, h), x.narrow(-1, h, h)
        return cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)
    st = x.device.backend.rope(operand_of(x), Rotary(operand_of(c), operand_of(s), interleaved), x.dtype)
    return x._new(st, x.shape)


def repeat_kv(x, n_rep):
    """(b, hk, t, d) -> (b, hk * n_rep, t, d) for grouped-query attention."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x.unsqueeze(2).expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def attention(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v. q (b, h, tq, d), k/v (b, hk, tk, d) with h a multiple of hk (GQA).
    mask: additive float, or bool where True means "may attend" (as in torch); broadcast to (b, h, tq, tk)."""
    q, k, v = float_input(q, "attention"), float_input(k, "attention"), float_input(v, "attention")
    check_devices("attention", q, k, v, mask)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeError(f"attention: q, k, v must be (batch, heads, seq, head_dim), "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    b, h, tq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or v.shape[:3] != k.shape[:3] or h % k.shape[1]:
        raise ShapeError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    hk = k.shape[1]
    n_rep = h // hk
    if n_rep > 1 and (tq == 1 or not is_causal) and mask is None and not needs_grad(q, k, v):
        # Grouped-query attention without copying K/V: the n_rep query heads that share a
        # KV head become extra query rows (a one-token causal step masks nothing).
        out = attention(q.reshape(b, hk, n_rep * tq, d), k, v, scale=scale)
        return out.reshape(b, h, tq, v.shape[3])
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    dtype = q.dtype
    k, v = k.to(dtype), v.to(dtype)
    tk = k.shape[2]
    lmask = None
    if mask is not None:
        if mask.dtype is D.bool_:
            mask = new_full(q, (), 0.0, dtype).where(mask, float("-inf"))
        mask = mask.to(dtype)
        lmask = mask._layout.broadcast_to((b, h, tq, tk), "attention mask")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if needs_grad(q, k, v, mask):
        scores = (q @ k.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores + mask
        if is_causal:
            banned = new_arange(q, tk).unsqueeze(0) > (new_arange(q, tq).unsqueeze(1) + (tk - tq))
            scores = scores.masked_fill(banned, float("-inf"))
        return scores.softmax(-1) @ v
    st = q.device.backend.attention(operand_of(q), operand_of(k), operand_of(v),
                                    None if mask is None else Operand(mask._storage, lmask), dtype,
                                    AttentionSpec(scale, is_causal))
    return q._new(st, (b, h, tq, v.shape[3]), dtype)


def conv(op, x, w, b, stride, padding, dilation, groups, nd):
    """conv1d (nd 1) or conv2d (nd 2), torch's semantics."""
    x, w = float_input(x, op), float_input(w, op)
    check_devices(op, x, w, b)
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise ShapeError(f"{op}: input {x.shape} and weight {w.shape} must both have {nd + 2} dims")
    cin, cout = x.shape[1], w.shape[0]
    if cin % groups or cout % groups or w.shape[1] * groups != cin:
        raise ShapeError(f"{op}: input channels {cin}, weight {w.shape} and groups={groups} do not fit "
                         f"(weight dim 1 must be in_channels / groups = {cin // max(groups, 1)})")
    dtype = D.promote(x.dtype, w.dtype)
    x, w = x.to(dtype), w.to(dtype)
    stride, padding, dilation = (_per_dim(v, nd) for v in (stride, padding, dilation))
    outs = []
    for i in range(nd):
        n = (x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
        if n <= 0:
            raise ShapeError(f"{op}: input {x.shape} is too small for kernel {w.shape[2:]} "
                             f"with padding {padding}, dilation {dilation}")
        outs.append(n)
    if needs_grad(x, w):
        y = _conv_composite(x, w, stride, padding, dilation, groups, outs)
    else:
        be = x.device.backend
        if nd == 1:
            st = be.conv1d(operand_of(x), operand_of(w), dtype, ConvSpec(stride[0], padding[0], dilation[0], groups))
        else:
            st = be.conv2d(operand_of(x), operand_of(w), dtype, ConvSpec(stride, padding, dilation, groups))
        y = x._new(st, (x.shape[0], cout, *outs), dtype)
    return y if b is None else y + b.to(dtype).reshape((1, cout) + (1,) * nd)


def _per_dim(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def _conv_composite(x, w, stride, padding, dilation, groups, outs):
    """Convolution as strided views + one matmul per group (differentiable through primitives)."""
    nd = len(stride)
    pads = []
    for p in reversed(padding):
        pads += [p, p]
    xp = pad(x, tuple(pads)) if any(padding) else x
    cols = []
    for kidx in _product([range(k) for k in w.shape[2:]]):
        key = (slice(None), slice(None)) + tuple(
            slice(kidx[i] * dilation[i], kidx[i] * dilation[i] + stride[i] * (outs[i] - 1) + 1, stride[i])
            for i in range(nd))
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


def custom(op, tensors):
    """A user-defined op (tallow.CustomOp): the backend runs the op's code for its device."""
    if not tensors:
        raise ShapeError(f"custom op {op.name!r}: needs at least one input tensor")
    check_devices(f"custom op {op.name!r}", *tensors)
    first = tensors[0]
    shape = tuple(op.output_shape(*[t.shape for t in tensors]))
    dtype = op.output_dtype(*[t.dtype for t in tensors])
    st = first.device.backend.custom(op, [(t._storage, t._layout, t.dtype) for t in tensors], shape, dtype)
    out = first._new(st, shape, dtype)
    if _Mode.enabled and any(t.requires_grad for t in tensors):
        record(out, tensors, lambda g: tuple(op.backward(tensors, out, g)))
    return out
