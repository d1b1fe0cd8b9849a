"""The BPE model: one pre-tokenized word -> token ids.

Merge order follows the `tokenizers` library exactly: repeatedly apply the
lowest-ranked merge, leftmost first (a heap of (rank, position)). Results are
cached per word, so a chat prompt with repeated words costs one dict lookup
per repeat.
"""
import array
import heapq

from ..errors import FormatError

_CACHE_LIMIT = 100_000


class BPE:
    def __init__(self, vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False,
                 ignore_merges=False, continuing_subword_prefix="", end_of_word_suffix="", pair_ranks=None):
        """vocab: {token: id}; merges: list of (left, right) pairs in rank order, or instead
        pair_ranks: an object whose get((left id, right id)) gives (rank, merged id) or None
        (gguf_spm.PairRanks: a SentencePiece vocabulary's merges, never listed)."""
        self.vocab = vocab
        self.unk_token = unk_token
        self.fuse_unk = fuse_unk
        self.byte_fallback = byte_fallback
        self.ignore_merges = ignore_merges
        self.prefix = continuing_subword_prefix or ""
        self.suffix = end_of_word_suffix or ""
        if unk_token is not None and unk_token not in vocab:
            raise FormatError(f"BPE unk_token {unk_token!r} is not in the vocabulary")
        # (left id, right id) -> (rank, merged id)
        self.merges = {} if pair_ranks is None else pair_ranks
        for rank, (left, right) in enumerate(merges):
            merged = left + (right[len(self.prefix):] if self.prefix else right)
            try:
                key = (vocab[left], vocab[right])
                self.merges[key] = (rank, vocab[merged])  # a repeated pair: the last wins, as in `tokenizers`
            except KeyError as e:
                raise FormatError(f"BPE merge {left!r} {right!r} uses a token missing from the vocabulary: "
                                  f"{e}") from None
        self._cache = {}
        # A token covers at most as many characters of a word as its string has.
        self.max_token_chars = max(map(len, vocab), default=1)

    def min_tokens(self, word):
        """A lower bound on len(self.tokenize(word)) found without tokenizing it: each character
        that is itself in the vocabulary becomes a symbol, and a token holds at most
        max_token_chars of them (0 with a subword prefix or suffix, which change the lookups)."""
        if self.prefix or self.suffix:
            return 0
        vocab = self.vocab
        if all(ch in vocab for ch in set(word)):
            return len(word) // self.max_token_chars
        return sum(1 for ch in word if ch in vocab) // self.max_token_chars

    @staticmethod
    def parse_merges(raw):
        """tokenizer.json / GGUF merges ("a b" strings or [a, b] lists) -> pairs."""
        pairs = []
        for m in raw:
            if isinstance(m, str):
                parts = m.split(" ")
                if len(parts) != 2:
                    raise FormatError(f"BPE merge {m!r} is not two tokens separated by one space")
                pairs.append((parts[0], parts[1]))
            else:
                pairs.append((m[0], m[1]))
        return pairs

    def tokenize(self, word):
        """One pre-token (already in the model's alphabet) -> list of ids."""
        if not word:
            return []
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
        else:
            ids = self._merge(self._initial_symbols(word))
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[word] = ids
        return ids

    def _initial_symbols(self, word):
        vocab = self.vocab
        ids = []
        unk = None  # pending unknown run: fused runs become one unk token
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = ch
            if i > 0 and self.prefix:
                s = self.prefix + s
            if i == last and self.suffix:
                s = s + self.suffix
            tid = vocab.get(s)
            if tid is not None:
                if unk is not None:
                    ids.append(unk)
                    unk = None
                ids.append(tid)
                continue
            if self.byte_fallback:
                fallback = [vocab.get("<0x%02X>" % b) for b in s.encode("utf-8")]
                if None not in fallback:
                    if unk is not None:
                        ids.append(unk)
                        unk = None
                    ids.extend(fallback)
                    continue
            if self.unk_token is not None:
                unk_id = vocab[self.unk_token]
                if unk is not None and not self.fuse_unk:
                    ids.append(unk)
                unk = unk_id
            # With neither a vocabulary entry, byte fallback nor unk token the
            # character is dropped -- exactly what `tokenizers` does.
        if unk is not None:
            ids.append(unk)
        return ids

    def _merge(self, ids):
        """Apply merges lowest rank first, leftmost on ties. The links are arrays and a heap
        entry is one int (rank << 32 | position), so a 10 MB word takes ~60 bytes a
        character rather than ~200 (a list of tuples)."""
        n = len(ids)
        if n < 2:
            return ids
        merges = self.merges
        nxt = array.array("q", range(1, n + 1))
        prv = array.array("q", range(-1, n - 1))
        alive = bytearray(b"\x01") * n
        heap = []
        for i in range(n - 1):
            m = merges.get((ids[i], ids[i + 1]))
            if m is not None:
                heap.append(m[0] << 32 | i)
        heapq.heapify(heap)
        while heap:
            key = heapq.heappop(heap)
            rank, pos = key >> 32, key & 0xFFFFFFFF
            if not alive[pos]:
                continue
            right = nxt[pos]
            if right >= n:
                continue
            m = merges.get((ids[pos], ids[right]))
            if m is None or m[0] != rank:
                continue  # a stale entry: one side has merged since
            new_id = m[1]
            ids[pos] = new_id
            alive[right] = 0
            after = nxt[right]
            nxt[pos] = after
            if after < n:
                prv[after] = pos
            before = prv[pos]
            if before >= 0:
                m = merges.get((ids[before], new_id))
                if m is not None:
                    heapq.heappush(heap, m[0] << 32 | before)
            if after < n:
                m = merges.get((new_id, ids[after]))
                if m is not None:
                    heapq.heappush(heap, m[0] << 32 | pos)
        return [t for t, a in zip(ids, alive) if a]
