"""Neural-network functions over tensors (tallow.functional, also tallow.nn.functional),
and the public functions that join, split or pick among tensors (tallow.cat, ...).

Each is one call into the op front end (ops/) or a composition of ops."""
from __future__ import annotations

from collections.abc import Sequence

from . import ops
from .errors import ShapeError
from .index_check import check_ids
from .tensor import Number, Operand, Tensor


# ---- joining, splitting, picking -----------------------------------------------------------
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return ops.cat(tensors, dim)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return ops.stack(tensors, dim)


def split(t: Tensor, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    return ops.split(t, split_size, dim)


def chunk(t: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return ops.chunk(t, chunks, dim)


def pad(t: Tensor, pads: Sequence[int], value: Number = 0.0) -> Tensor:
    """torch-style constant padding: pads = (last_lo, last_hi, second_last_lo, ...)."""
    return ops.pad(t, pads, value)


def where(cond: Tensor, a: Operand, b: Operand) -> Tensor:
    """a where cond else b; a and b may be tensors or Python scalars; all broadcast together."""
    return ops.where(cond, a, b)


# ---- activations -------------------------------------------------------------------------------
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return ops.softmax(x, dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return ops.softmax(x, dim, log=True)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return ops.gelu(x, approximate)


def silu(x: Tensor) -> Tensor:
    return ops.unary(x, "silu")


def relu(x: Tensor) -> Tensor:
    return ops.unary(x, "relu")


def sigmoid(x: Tensor) -> Tensor:
    return ops.unary(x, "sigmoid")


def tanh(x: Tensor) -> Tensor:
    return ops.unary(x, "tanh")


# ---- layers ------------------------------------------------------------------------------------
def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise over the last dim (mean 0, variance 1), then scale and shift."""
    return ops.layer_norm(x, weight, bias, eps)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    return ops.rms_norm(x, weight, eps)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias; a quantised weight is dequantised inside the backend's kernel."""
    return ops.linear(x, weight, bias)


def embedding(ids: Tensor | Sequence, table: Tensor) -> Tensor:
    idx = ops.as_index(ids, table, "embedding")
    check_ids(idx, table.shape[0], "embedding", 0, "id")  # named here: a negative token id is a caller's bug
    rows = ops.index_select(table, 0, idx.reshape(-1))
    return rows.reshape(idx.shape + (table.shape[-1],))


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1) -> Tensor:
    return ops.conv("conv1d", x, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
    return ops.conv("conv2d", x, weight, bias, stride, padding, dilation, groups, 2)


def rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotary position embedding. x (b, h, t, d); cos and sin (t, d/2).
    interleaved=False is the half-split (GPT-NeoX / Llama HF) form, True the GPT-J form."""
    return ops.rotary_emb(x, cos, sin, interleaved)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(b, hk, t, d) -> (b, hk * n_rep, t, d) for grouped-query attention."""
    return ops.repeat_kv(x, n_rep)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v. q (b, h, tq, d), k/v (b, hk, tk, d) with h a multiple of hk (GQA).
    mask: additive float, or bool where True means "may attend" (as in torch); broadcast to (b, h, tq, tk)."""
    return ops.attention(q, k, v, mask, is_causal, scale)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None,
                 eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(x + residual, rms_norm(x + residual, weight, eps)) as one op: a residual add and the next norm."""
    return ops.add_rms_norm(x, residual, weight, eps)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """(x + residual, layer_norm(x + residual, weight, bias, eps)) as one op."""
    return ops.add_layer_norm(x, residual, weight, bias, eps)


def gated_linear(x: Tensor, weight: Tensor, act: str = "silu") -> Tensor:
    """act(x @ gate.T) * (x @ up.T) with weight the [gate; up] rows (2 * out, in), float or quantised."""
    return ops.gated_linear(x, weight, act)


def add_norm_linear(x: Tensor, residual: Tensor | None, norm_weight: Tensor | None, norm_bias: Tensor | None,
                    weight: Tensor, bias: Tensor | None = None, kind: str = "rms", eps: float = 1e-6,
                    act: str | None = None, gated: bool = False) -> tuple[Tensor, Tensor]:
    """(hidden, y): hidden = x + residual (x when residual is None), y = linear(norm(hidden), weight, bias)
    with norm an RMS ("rms") or layer ("layer") norm, then act(y); gated: act(gate) * up for weight rows
    [gate; up] as gated_linear. One op (one kernel on wgpu when decoding one row)."""
    return ops.add_norm_linear(x, residual, norm_weight, norm_bias, weight, bias, kind, eps, act, gated)


def kv_write(k: Tensor, v: Tensor, k_slot: Tensor, v_slot: Tensor) -> None:
    """Write k into k_slot and v into v_slot in place (a KV cache's new positions) as one op."""
    ops.kv_write(k, v, k_slot, v_slot)


def rope_kv_write(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_slot: Tensor, v_slot: Tensor,
                  interleaved: bool = False) -> Tensor:
    """rotary_emb(q); writes rotary_emb(k) into k_slot and v into v_slot in place (a KV cache's new positions)."""
    return ops.rope_kv_write(q, k, v, cos, sin, k_slot, v_slot, interleaved)


def cache_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, position: int,
                    cos: Tensor | None = None, sin: Tensor | None = None, interleaved: bool = False,
                    scale: float | None = None, key_start: int = 0, mask: Tensor | None = None,
                    window: int | None = None) -> Tensor:
    """Write k (rotary_emb(k) with cos/sin) and v into a preallocated KV cache at `position` and return
    causal attention of q (rotated likewise) over the cache's keys [key_start, position + t), as one op.
    window: a one-query step's sliding window (key_start = max(0, position + 1 - window)), which a
    captured step slides at later positions."""
    return ops.cache_attention(q, k, v, k_cache, v_cache, position, cos, sin, interleaved, scale, key_start, mask,
                               window)



def batch_cache_attention(q: Tensor, k: Tensor, v: Tensor, k_caches: Sequence[Tensor], v_caches: Sequence[Tensor],
                          positions: Sequence[int], cos: Tensor | None = None, sin: Tensor | None = None,
                          interleaved: bool = False, scale: float | None = None,
                          key_starts: Sequence[int] | None = None) -> Tensor:
    """cache_attention of a batch of sequences, one new position each: row i is written into its own
    caches k_caches[i], v_caches[i] at positions[i] (rotated by row i of cos/sin) and attends over them."""
    return ops.batch_cache_attention(q, k, v, k_caches, v_caches, positions, cos, sin, interleaved, scale, key_starts)

# ---- losses ------------------------------------------------------------------------------------
def cross_entropy(logits: Tensor, targets: Tensor | Sequence[int]) -> Tensor:
    """Mean negative log-likelihood of integer class targets under softmax(logits); logits (n, classes)."""
    tgt = ops.as_index(targets, logits, "cross_entropy")
    if logits.ndim != 2 or tgt.shape != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: logits must be (n, classes) and targets (n,), "
                         f"got {logits.shape} and {tgt.shape}")
    picked = ops.gather(ops.softmax(logits, -1, log=True), 1, tgt.unsqueeze(1))
    return -picked.mean()


def mse_loss(pred: Tensor, target: Tensor) -> Tensor:
    return (pred - target).square().mean()
