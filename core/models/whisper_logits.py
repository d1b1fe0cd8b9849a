"""The last-position logits of a decoding step, on the host, with the few
operations the logit filters and token decoders need.

The decoder's logits (a handful of rows of ~52k floats) are brought to the host
once per step: the rules (suppression, timestamp pairing, beam ranking) are
sequential, data-dependent decisions, so doing them on the host costs one
transfer instead of many tiny device ops. numpy when it is importable, plain
Python lists otherwise (Pyodide without numpy), with the same results.
"""
import heapq
import math

NEG_INF = float("-inf")


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def logit_rows(t, use_numpy=None):
    """LogitRows over a (rows, vocab) tallow tensor."""
    np = _numpy() if use_numpy in (None, True) else None
    if use_numpy and np is None:
        raise ImportError("numpy is not installed")
    return NumpyRows(t.numpy().astype(np.float32, copy=False)) if np is not None else PythonRows(t.tolist())


class NumpyRows:
    def __init__(self, array):
        import numpy as np
        self.np = np
        self.a = np.array(array, dtype=np.float32).reshape(len(array), -1)
        self.n, self.vocab = self.a.shape

    def suppress(self, k, start, end=None):
        """Row k (None: every row), tokens [start, end) become impossible."""
        self.a[slice(None) if k is None else k, start:end] = NEG_INF

    def suppress_ids(self, ids):
        if ids:
            self.a[:, list(ids)] = NEG_INF

    def max(self, k, start=0, end=None):
        part = self.a[k, start:end]
        return float(part.max()) if part.size else NEG_INF

    def logsumexp(self, k, start=0, end=None):
        part = self.a[k, start:end]
        m = float(part.max()) if part.size else NEG_INF
        if m == NEG_INF:
            return NEG_INF
        return m + math.log(float(self.np.exp(part - m, dtype=self.np.float32).sum(dtype=self.np.float64)))

    def argmax(self, k):
        return int(self.a[k].argmax())

    def topk(self, k, n, lse):
        """The n most probable tokens of row k as (logprob, token), best first."""
        row = self.a[k]
        n = min(n, row.size)
        idx = self.np.argpartition(-row, n - 1)[:n]
        idx = idx[self.np.lexsort((idx, -row[idx]))]  # by value, ties by lower id
        return [(float(row[i]) - lse, int(i)) for i in idx]

    def value(self, k, token):
        return float(self.a[k, token])

    def sample(self, k, temperature, rng):
        z = self.a[k].astype(self.np.float64) / temperature
        p = self.np.exp(z - z.max())
        c = self.np.cumsum(p)
        return int(min(self.np.searchsorted(c, rng.random() * c[-1], side="right"), self.vocab - 1))


class PythonRows:
    def __init__(self, rows):
        self.a = [list(map(float, r)) for r in rows]
        self.n, self.vocab = len(self.a), len(self.a[0]) if self.a else 0

    def suppress(self, k, start, end=None):
        for r in (self.a if k is None else [self.a[k]]):
            stop = len(r) if end is None else min(end, len(r))
            if stop > start:
                r[start:stop] = [NEG_INF] * (stop - start)

    def suppress_ids(self, ids):
        for r in self.a:
            for i in ids:
                r[i] = NEG_INF

    def max(self, k, start=0, end=None):
        part = self.a[k][start:end]
        return max(part) if part else NEG_INF

    def logsumexp(self, k, start=0, end=None):
        part = self.a[k][start:end]
        m = max(part) if part else NEG_INF
        if m == NEG_INF:
            return NEG_INF
        exp = math.exp
        return m + math.log(math.fsum(exp(x - m) for x in part))

    def argmax(self, k):
        row = self.a[k]
        return row.index(max(row))

    def topk(self, k, n, lse):
        row = self.a[k]
        cut = heapq.nlargest(n, row)[-1]  # C-speed on floats; then only the few at or above it
        best = sorted((-x, i) for i, x in enumerate(row) if x >= cut)[:n]
        return [(-x - lse, i) for x, i in best]

    def value(self, k, token):
        return self.a[k][token]

    def sample(self, k, temperature, rng):
        row = self.a[k]
        m = max(row)
        weights = [math.exp((x - m) / temperature) for x in row]
        return rng.choices(range(len(row)), weights=weights)[0]
