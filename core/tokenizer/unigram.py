"""The Unigram model (SentencePiece): one pre-tokenized word -> token ids.

Viterbi over the pieces that match at each position, exactly as the
`tokenizers` library does it: candidates at a position are tried shortest
first and replace the best path only when strictly better; a character no
single piece covers becomes <unk> scored min_score - 10; runs of <unk> fuse
into one piece, which byte fallback then spells as <0xNN> tokens.
"""
from ..errors import FormatError

_UNK_PENALTY = 10.0
_CACHE_LIMIT = 100_000


class Unigram:
    def __init__(self, pieces, unk_id=None, byte_fallback=False):
        """pieces: list of (token, score) in id order; unk_id: index of <unk> or None."""
        if unk_id is not None and not 0 <= unk_id < len(pieces):
            raise FormatError(f"Unigram unk_id {unk_id} is outside the vocabulary ({len(pieces)} pieces)")
        self.pieces = pieces
        self.unk_id = unk_id
        self.byte_fallback = byte_fallback
        self.vocab = {}
        for i, (token, _score) in enumerate(pieces):
            self.vocab[token] = i  # a repeated piece: the last id wins, as in `tokenizers`
        self.scores = [score for _token, score in pieces]
        self.min_score = min(self.scores, default=float("inf"))
        # The longest piece bounds the prefixes tried at each position.
        self.max_len = max((len(t) for t, _ in pieces), default=0)
        self._cache = {}

    def tokenize(self, word):
        if not word:
            return []
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        ids = []
        for piece in self._best_pieces(word):
            tid = self.vocab.get(piece)
            if tid is None:
                tid = self._unknown(piece, ids)
            if tid is not None:
                ids.append(tid)
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[word] = ids
        return ids

    def _unknown(self, piece, ids):
        """An unknown piece: its bytes appended as <0xNN> tokens when all exist, else the unk id."""
        if self.byte_fallback:
            fallback = [self.vocab.get("<0x%02X>" % b) for b in piece.encode("utf-8")]
            if None not in fallback:
                ids.extend(fallback)
                return None
        if self.unk_id is None:
            raise FormatError(f"Unigram: {piece!r} is not in the vocabulary and the model has no unk_id")
        return self.unk_id

    def _best_pieces(self, word):
        n = len(word)
        vocab, scores = self.vocab, self.scores
        unk_score = self.min_score - _UNK_PENALTY
        best = [0.0] * (n + 1)      # score of the best path ending at each position
        start = [None] * (n + 1)    # where the last piece of that path starts
        piece_id = [None] * (n + 1)
        for i in range(n):
            here = best[i]
            single = False
            for end in range(i + 1, min(n, i + self.max_len) + 1):
                tid = vocab.get(word[i:end])
                if tid is None:
                    continue
                score = scores[tid] + here
                if start[end] is None or score > best[end]:
                    best[end], start[end], piece_id[end] = score, i, tid
                if end == i + 1:
                    single = True
            if not single:
                score = unk_score + here
                if start[i + 1] is None or score > best[i + 1]:
                    if self.unk_id is None:
                        raise FormatError(f"Unigram: {word[i]!r} is not in the vocabulary and the model has no unk_id")
                    best[i + 1], start[i + 1], piece_id[i + 1] = score, i, self.unk_id
        pieces = []
        unknown = []  # a run of unk pieces, right to left, fused into one
        end = n
        while end > 0:
            begin = start[end]
            if self.unk_id is not None and piece_id[end] == self.unk_id:
                unknown.append(word[begin:end])
            else:
                if unknown:
                    pieces.append("".join(reversed(unknown)))
                    unknown = []
                pieces.append(word[begin:end])
            end = begin
        if unknown:
            pieces.append("".join(reversed(unknown)))
        pieces.reverse()
        return pieces
