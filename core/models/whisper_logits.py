"""The last-position logits of a decoding step, on the host, with the few
operations the logit filters and token decoders need.

The decoder's logits (a handful of rows of ~52k floats) are brought to the host
device once per step: the rules (suppression, timestamp pairing, beam ranking)
are sequential, data-dependent decisions, so doing them on the host costs one
transfer instead of many tiny device ops. They are tensor ops on the host backend
(numpy's, or pure Python's where numpy is missing), so one implementation serves both.
"""
import heapq
import math

from ..backends.host import host_device
from ..creation import tensor
from ..dtypes import bool_, f32, f64, i64

NEG_INF = float("-inf")
TOPK_ROWS = 32  # topk reads the column maxima of a (TOPK_ROWS, -1) view of a row first


def logit_rows(t):
    """LogitRows over a (rows, vocab) tallow tensor (a copy on the host: filters write to it)."""
    return LogitRows(t.to(host_device()).to(f32).clone())


_MASKS: dict = {}  # (ids, vocab, device) -> bool (1, vocab) tensor; a few per process


def _id_mask(ids, vocab, device):
    """A bool (1, vocab) tensor, True at ids. Built once per id list: the suppress filters apply
    the same list at every step (an index scatter per step took ~2 ms of a ~10 ms step)."""
    key = (ids, vocab, device.type, id(device.backend))
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) >= 16:  # a long-running process with many option sets: start over
            _MASKS.clear()
        hit = set(ids)
        mask = _MASKS[key] = tensor([[i in hit for i in range(vocab)]], dtype=bool_, device=device)
    return mask


class LogitRows:
    def __init__(self, a):
        self.a = a
        self.n, self.vocab = a.shape

    def suppress(self, k, start, end=None):
        """Row k (None: every row), tokens [start, end) become impossible."""
        self.a[slice(None) if k is None else k, start:end] = NEG_INF

    def suppress_ids(self, ids):
        if ids:  # one op whatever the count, over a mask built once per id list
            self.a = self.a.masked_fill(_id_mask(tuple(ids), self.vocab, self.a.device), NEG_INF)

    def max(self, k, start=0, end=None):
        part = self.a[k, start:end]
        return part.max().item() if part.numel() else NEG_INF

    def logsumexp(self, k, start=0, end=None):
        part = self.a[k, start:end]
        m = part.max().item() if part.numel() else NEG_INF
        if m == NEG_INF:
            return NEG_INF
        return m + math.log((part - m).exp().to(f64).sum().item())  # exp in f32, summed in f64

    def argmax(self, k):
        return self.a[k].argmax().item()  # the first of equal maxima: the lower id

    def topk(self, k, n, lse):
        """The n most probable tokens of row k as (logprob, token), best first; ties by lower id.
        Seen as (TOPK_ROWS, cols), the row's columns are groups of tokens; the n-th largest value
        is at least the n-th largest column maximum (n columns reach it), so only the columns
        whose maximum reaches it (and the short tail) come to Python."""
        row = self.a[k]
        n = min(n, self.vocab)
        cols = self.vocab // TOPK_ROWS
        whole = cols * TOPK_ROWS
        grid = row.narrow(0, 0, whole).reshape(TOPK_ROWS, cols)
        col_max = grid.max(0).tolist() if whole else []  # max down each column: a fast axis-0 reduce
        cut = heapq.nlargest(n, col_max)[-1] if len(col_max) >= n else NEG_INF
        picked = [c for c, m in enumerate(col_max) if m >= cut]
        candidates = []
        if picked:
            values = grid.index_select(1, tensor(picked, dtype=i64, device=row.device)).tolist()
            candidates = [(-v, r * cols + c) for r, vs in enumerate(values) for c, v in zip(picked, vs)]
        candidates += [(-v, whole + i) for i, v in enumerate(row.narrow(0, whole, self.vocab - whole).tolist())]
        return [(-v - lse, token) for v, token in heapq.nsmallest(n, candidates)]

    def value(self, k, token):
        return self.a[k, token].item()

    def sample(self, k, temperature, rng):
        """A token drawn with probability softmax(row / temperature), by one uniform draw of rng."""
        z = self.a[k].to(f64) / temperature
        cumulative = (z - z.max()).exp().cumsum(0)
        draw = rng.random() * cumulative[-1].item()
        return min((cumulative <= draw).sum().item(), self.vocab - 1)
