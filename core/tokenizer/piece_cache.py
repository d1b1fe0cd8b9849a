"""Encoding a chat history again each turn at the cost of its new text.

A tokenizer splits text at its raw (not normalized) added tokens first --
"<|im_start|>", "<|im_end|>" -- and tokenizes the pieces between them each on
its own: a piece's ids depend only on the piece and on whether it begins the
text. A chat template puts such tokens around every message, so the pieces of a
re-rendered history are the pieces of the last rendering plus the new turn's:
their ids are kept here, and only pieces not seen before are tokenized. The ids
are the tokenizer's own, exactly (tests compare with a full encode).

Without this, `chat(..., history_policy="drop_oldest")` re-tokenized the whole
history for every turn it tried dropping: 500 turns took 99 s.
"""
import threading

from .added_tokens import AddedToken, AddedTokenMatcher

_MAX_CHARS = 1 << 22  # text held in the cache (~4 MB); the oldest pieces go first


class _NotSeparable(Exception):
    """This backend cannot encode the piece apart from the text around it."""


class PieceCache:
    def __init__(self, impl, added_tokens):
        self._impl = impl
        self._ids = {}   # (piece, begins the text) -> tuple of ids, oldest use first
        self._chars = 0
        self._lock = threading.Lock()
        self._sep = None
        if impl.name == "python":
            self.matcher = impl.raw_matcher
        else:
            tokens = [AddedToken.from_json(d) for d in added_tokens if not d.get("normalized", not d.get("special"))]
            for t in tokens:
                t.id = impl.token_to_id(t.content)
            self.matcher = AddedTokenMatcher(tokens)
            # A piece that does not begin the text is encoded after a plain added token (one that
            # strips no spaces): the library then treats it as it does inside the whole text.
            plain = [t for t in tokens if not (t.lstrip or t.rstrip or t.single_word) and t.id is not None]
            self._sep = (plain[0].content, plain[0].id) if plain else None

    def _separable(self, first):
        return self._impl.name == "python" or first or self._sep is not None

    def _encode_piece(self, piece, first, limit):
        """ids of one piece; None once they number more than limit."""
        impl = self._impl
        if impl.name == "python":
            out = []
            return out if impl._encode_piece(piece, out, first, limit) else None
        if first:
            return impl.encode(piece, False, limit)
        text, sep_id = self._sep
        ids = impl.encode(text + piece, False, None if limit is None else limit + 1)
        if ids is not None and ids[:1] != [sep_id]:  # it joined the piece into a longer added token
            raise _NotSeparable
        return None if ids is None else ids[1:]

    def encode(self, text, limit=None):
        """encode(text, add_special_tokens=False, limit), reusing the ids of pieces seen before."""
        ids = []
        for i, (piece, tid) in enumerate(self.matcher.split(text)):
            if tid is not None:
                ids.append(tid)
            elif piece:
                try:
                    if not self._separable(i == 0):
                        raise _NotSeparable
                    part = self._lookup(piece, i == 0, None if limit is None else limit - len(ids))
                except _NotSeparable:  # encoded all at once, as without the cache
                    return self._impl.encode(text, False, limit)
                if part is None:
                    return None
                ids.extend(part)
            if limit is not None and len(ids) > limit:
                return None
        return ids

    def _lookup(self, piece, first, limit):
        key = (piece, first)
        with self._lock:
            hit = self._ids.pop(key, None)
            if hit is not None:
                self._ids[key] = hit  # now the most recent
                return hit
        part = self._encode_piece(piece, first, limit)
        if part is None:
            return None
        part = tuple(part)
        with self._lock:
            if key not in self._ids:
                self._ids[key] = part
                self._chars += len(piece)
            while self._chars > _MAX_CHARS and len(self._ids) > 1:
                old = next(iter(self._ids))
                self._chars -= len(old[0])
                del self._ids[old]
        return part
