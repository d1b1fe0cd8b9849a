"""Range checks for integer ids (index_select, gather, scatter_add, embedding lookups)
done once in front of every backend: numpy would wrap a negative id or raise its own
IndexError, the pure-Python backend its own message, and a GPU kernel would read past
the row. Here every one is the same tallow IndexRangeError naming op, dim, id and range."""
from .errors import IndexRangeError, UnsupportedError


# Up to this many ids are read back whole (one transfer from a GPU); longer indices are
# reduced on their device first, so only two numbers come back.
_READ_WHOLE = 4096


def _bounds(index):
    """(smallest, largest) id."""
    if index.numel() > _READ_WHOLE:
        try:
            return index.min().item(), index.max().item()
        except UnsupportedError:  # a backend without integer reductions: read the ids
            pass
    ids = index.reshape(-1).tolist()
    return min(ids), max(ids)


def check_ids(index, size, op, dim=0, what="index"):
    """Raise IndexRangeError unless every id in the integer tensor `index` is in [0, size)."""
    if index.numel() == 0:
        return
    lo, hi = _bounds(index)
    if lo >= 0 and hi < size:
        return
    bad = next(i for i in index.reshape(-1).tolist() if not 0 <= i < size)
    valid = f"0 to {size - 1}" if size else "none: the dim is empty"
    raise IndexRangeError(f"{op}: {what} {bad} is out of range for dim {dim} of size {size} (valid: {valid})")
