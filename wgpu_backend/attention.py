"""The wgpu backend's row kernels and attention: softmax, norms, rotary embeddings, attention
(attend.wgsl; cache_attend.wgsl for one-token decode over a KV cache, split-K over long caches) and
KV-cache writes."""

from tallow.backends.gpu_plan import f32_bits
from tallow.backends.operand import Operand, parts
from tallow.dtypes import f32
from tallow.layout import Layout

from .common import _layout_words

# Up to this many query rows per (batch, head) attention runs as one kernel (kernels/attend.wgsl)
# reading the KV cache directly; longer prompts keep scores, softmax and weighted sum as three
# dispatches, whose matmuls share loads between rows.
ATTEND_MAX_ROWS = 16
# Split-K (flash-decoding) for one-token attention over a long KV cache: one workgroup per
# query head leaves most of a real GPU idle (SmolLM2: 9 workgroups), so a cache of at least
# SPLIT_K_MIN_KEYS slots has its keys split among workgroups of KEYS_PER_SPLIT (at most
# MAX_SPLITS), and a second small dispatch joins their partial softmaxes. The split count comes
# from the cache's capacity, never its length, so a captured step replays at any position
# (empty splits weigh nothing). Not tuned on the CPU-emulated adapters.
SPLIT_K_MIN_KEYS = 1024
KEYS_PER_SPLIT = 256
MAX_SPLITS = 64


class AttentionOps:
    """WgpuBackend's softmax, norms, rope, attention and KV-cache writes (a mixin)."""

    def _softmax_kernel(self, storage, layout, out, log, dtype, scale=1.0, mask=None, lmask=None, causal=False):
        """kernels/softmax.wgsl, one workgroup per row, strided; scale, mask and the causal limit
        fused in for the unfused attention."""
        numel = layout.numel()
        d = layout.shape[-1] if layout.shape else 1
        rows = numel // d
        tq = layout.shape[-2] if len(layout.shape) >= 2 else 1
        ops = [(storage, layout.offset, layout.strides)]
        ops.append((mask, lmask.offset, lmask.strides) if mask is not None else (storage, 0, [0] * len(layout.shape)))
        words = _layout_words(layout.shape or (1,), [(o, s or [0]) for _, o, s in ops], True, "softmax")
        extras = [d, f32_bits(scale), int(mask is not None), int(causal), d - tq, int(log), tq, rows]
        self._run("softmax", {"X": dtype}, [s for s, _, _ in ops] + [out], self._params(words, extras), rows,
                  label="softmax")

    def _norm_kernel(self, x, norm, out, dtype):
        """kernels/norm.wgsl, one workgroup per row; x, w and b strided (w and b broadcast)."""
        (x, lx), (w, lw), (b, lb), eps, center = x, parts(norm.weight), parts(norm.bias), norm.eps, norm.center
        d = lx.shape[-1]
        rows = lx.numel() // d
        ops = [(x, lx.offset, lx.strides)]
        for st, lay in ((w, lw), (b, lb)):
            if st is None:
                ops.append((x, 0, [0] * len(lx.shape)))
            else:
                bl = lay.broadcast_to(lx.shape, "norm weight")
                ops.append((st, bl.offset, bl.strides))
        words = _layout_words(lx.shape, [(o, s) for _, o, s in ops], True, "norm")
        extras = [d, int(center), f32_bits(eps), int(w is not None), int(b is not None), rows]
        self._run("norm", {"X": dtype}, [s for s, _, _ in ops] + [out], self._params(words, extras), rows,
                  extra=("row_sum",), label="layer_norm" if center else "rms_norm")

    def _rope_kernel(self, x, rotary, out, dtype):
        (x, lx), ((cos, lcos), (sin, lsin), interleaved) = x, rotary
        *lead, d = lx.shape
        h = d // 2
        sd = lx.strides[-1]
        pair_shape = tuple(lead) + (h,)
        x_strides = list(lx.strides[:-1]) + [2 * sd if interleaved else sd]
        partner = sd if interleaved else h * sd
        lc = lcos.broadcast_to(pair_shape, "rope cos")
        ls = lsin.broadcast_to(pair_shape, "rope sin")
        words = _layout_words(pair_shape, [(lx.offset, x_strides), (lc.offset, lc.strides), (ls.offset, ls.strides)],
                              False, "rope")
        extras = [partner, int(interleaved), h]
        self._run("rope", {"X": dtype}, [x, cos, sin, out], self._params(words, extras), (words[0] + 255) // 256,
                  label="rope")

    def _attention_fits(self, lq, lk, lv):
        """attend.wgsl: a few query rows (longer prompts share loads in the matmuls), keys and
        values as rows of contiguous features read as vec4s."""
        return lq.shape[2] <= ATTEND_MAX_ROWS and self._attend_fits(lk, lv)

    @staticmethod
    def _attend_fits(lk, lv):
        return all(lay.shape[3] <= 256 and lay.shape[3] % 4 == 0 and lay.strides[3] == 1 and lay.offset % 4 == 0
                   and all(st % 4 == 0 for st in lay.strides[:3]) for lay in (lk, lv))

    def _attention_unfused(self, q, k, v, mask, dtype, spec):
        """Three dispatches: scores = q k^T (strided matmul, or matvec when decoding), a fused
        scale + mask + causal softmax, then p v."""
        lk = k.layout
        *batch, tq, _ = q.layout.shape
        tk = lk.shape[-2]
        nd = len(lk.shape)
        kt = lk.permute(list(range(nd - 2)) + [nd - 1, nd - 2])
        scores = self.matmul(q, Operand(k.storage, kt), dtype)
        sl = Layout(tuple(batch) + (tq, tk))
        probs = self._new(sl.numel(), dtype)
        if sl.numel():
            self._softmax_kernel(scores, sl, probs, False, dtype, spec.scale, *parts(mask), spec.causal)
        return self.matmul(Operand(probs, sl), v, dtype)

    def _attention_kernel(self, qkv, mask, out, dtype, spec, over_cache):
        """One dispatch: kernels/attend.wgsl, one workgroup per query row."""
        ((q, lq), (k, lk), (v, lv)), (mask, lmask), scale, causal = qkv, parts(mask), spec.scale, spec.causal
        b, h, tq, d = lq.shape
        tk, dv = lk.shape[2], lv.shape[3]
        rows = b * h * tq
        words = [rows, h, tq, 0 if over_cache else tk, d, dv, f32_bits(scale), int(causal), int(mask is not None)]
        for lay in (lq, lk, lv, lmask if mask is not None else lq):
            words += [lay.offset, *lay.strides]
        prelude, binds = self._step_variant([q, k, v, mask if mask is not None else q, out], over_cache)
        self._run("attend", {"X": dtype}, binds, words, self._grid(rows, "attention"), label="attention",
                  prelude=prelude, extra=("workgroup_max_sum",))

    def _cache_attention_fits(self, lkc, lvc):
        return self._attend_fits(lkc, lvc)

    def _cache_attention_kernel(self, qkv, cache, rotary, dtype, spec):
        """One-token decode: kernels/cache_attend.wgsl rotates, appends and attends in one dispatch;
        over a long cache its splits' partial results take a second (kernels/attend_combine.wgsl)."""
        (q, lq), (k, lk), (v, lv) = qkv
        (kc, lkc), (vc, lvc) = cache
        (cos, lcos), (sin, lsin) = ((None, None), (None, None)) if rotary is None else rotary[:2]
        interleaved = rotary is not None and rotary.interleaved
        position, key_start, scale = spec.position, spec.key_start, spec.scale
        b, h, _, d = lq.shape
        hk, capacity, dv = lk.shape[1], lkc.shape[2], lv.shape[3]
        rows = b * h
        out = self._new(rows * dv, dtype)
        if rows * dv == 0:
            return out
        cap = self._capture()
        # While capturing (over the whole cache), the position comes from the step buffer: the
        # parameters hold 0 and the rotary rows relative to it, so one launch serves every step.
        # (A window's first key moves with the position: such a step records it as it is, and
        # tallow.capture's same_launches check then finds the step not replayable.)
        from_step = cap is not None and key_start == 0 and position == cap.position
        pos = cap.position if from_step else 0
        avail = capacity - key_start
        splits = 1 if avail < SPLIT_K_MIN_KEYS else min(MAX_SPLITS, -(-avail // KEYS_PER_SPLIT))
        per_split = -(-avail // splits)
        words = [rows, h, h // hk, d, dv, f32_bits(scale), position - pos, key_start, int(cos is not None),
                 int(interleaved), splits, per_split]
        for lay in (lq, lk, lv, lkc, lvc):
            words += [lay.offset, *lay.strides]
        for lay in (lcos, lsin):
            words += [0, 0, 0] if lay is None else [lay.offset - pos * lay.strides[0], *lay.strides]
        dest = out if splits == 1 else self._new(rows * splits * (dv + 2), f32)
        tables = [cos, sin] if cos is not None else [q, q]
        prelude, binds = self._step_variant([q, k, v, *tables, kc, vc, dest], from_step)
        self._run("cache_attend", {"X": dtype, "Y": dtype if splits == 1 else f32}, binds, words,
                  self._grid(rows * splits, "cache_attention"), label="cache_attention", prelude=prelude,
                  extra=("workgroup_max_sum",))
        if splits > 1:
            self._run("attend_combine", {"X": dtype}, [dest, out], [rows, splits, dv], self._grid(rows, "attention"),
                      label="attention_combine")
        return out

    def _add_norm_kernel(self, x, r, norm, total, out, dtype):
        """kernels/add_norm.wgsl, one workgroup per row, reading x, r, w and b strided."""
        (x, lx), (r, lr), (w, lw), (b, lb) = x, r, parts(norm.weight), parts(norm.bias)
        eps, center = norm.eps, norm.center
        d = lx.shape[-1]
        rows = lx.numel() // d
        words = _layout_words(lx.shape, [(lx.offset, lx.strides), (lr.offset, lr.strides)], True, "add_norm")
        extras = [d, int(w is not None), f32_bits(eps), rows, int(center), int(b is not None)]
        for lay in (lw, lb):
            extras += [0, 0] if lay is None else [lay.offset, lay.strides[0]]
        label = "add_layer_norm" if center else "add_rms_norm"
        self._run("add_norm", {"X": dtype}, [x, r, w if w is not None else x, b if b is not None else x, total, out],
                  self._params(words, extras), rows, extra=("row_sum",), label=label)

    def _kv_write_kernel(self, k, v, kc, vc, words, nk, nv, dtype):
        prelude, binds = self._step_variant([k, v, kc, vc], self._capture() is not None)
        self._run("kv_write", {"X": dtype}, binds, [nk, nv] + words, (nk + nv + 255) // 256, label="kv_write",
                  prelude=prelude)

    def _rope_kv_write_kernel(self, q, k, v, cos, sin, kc, vc, out, words, pairs, dims, interleaved, dtype):
        prelude, binds = self._step_variant([q, k, v, cos, sin, kc, vc, out], self._capture() is not None)
        self._run("rope_kv", {"X": dtype}, binds, [pairs, *dims, int(interleaved)] + words, (pairs + 255) // 256,
                  label="rope_kv_write", prelude=prelude)
