"""Incremental decoding for streaming generation.

Decodes a short window of recent ids and emits only the text that the newest
id completed; text ending in U+FFFD (an unfinished UTF-8 character) waits for
the next id. The prefix kept in the window lets decoders that treat the first
token specially (leading-space stripping) behave as in a full decode.

The wait is bounded, so each step decodes a few ids whatever the model emits:
text before the trailing U+FFFD run goes out at once (`tokenizers`' ByteFallback
shows a whole run of byte tokens as U+FFFD until it is valid UTF-8, so the run is
held whole), and after _STALLED ids with no new text (each id adds a byte and a
character has at most 4, so valid bytes would have become text by then) or
_MAX_PENDING held ids in all, the run goes out as it is. Without the bound a
stream of impossible bytes re-decoded every held id each step: 8,192 steps took
13.6 s and emitted nothing.
"""

_STALLED = 4
_MAX_PENDING = 8


class StreamDecoder:
    def __init__(self, tokenizer, skip_special_tokens=False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = []    # the window: already-emitted context, then pending ids
        self._read = 0    # ids before this index have been emitted
        self._sent = 0    # characters of the pending ids' text already emitted
        self._stalled = 0  # ids since the pending text last grew

    def _decode(self, ids):
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def _pending_text(self):
        prefix_text = self._decode(self._ids[:self._read])
        new_text = self._decode(self._ids)
        return new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""

    def step(self, token_id):
        """Feed one id; return the newly completed text ('' if none yet)."""
        self._ids.append(int(token_id))
        text = self._pending_text()
        pending = len(self._ids) - self._read
        if not text:
            if pending >= _STALLED:  # ids that add no text (skipped specials): no need to keep them
                del self._ids[self._read:]
            return ""
        held = len(text) - len(text.rstrip("\ufffd"))
        if held and pending < _MAX_PENDING:
            ready = len(text) - held
            self._stalled = 0 if ready > self._sent else self._stalled + 1
            if self._stalled < _STALLED:
                out = text[self._sent:ready]
                self._sent = max(self._sent, ready)
                return out
        # All of it is final. Keep only the ids just emitted as context for the next step.
        out = text[self._sent:]
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        self._sent = self._stalled = 0
        return out

    def flush(self):
        """Return whatever is still held (an unfinished character decodes to U+FFFD) and reset."""
        out = self._pending_text()[self._sent:]
        self._ids = []
        self._read = self._sent = self._stalled = 0
        return out
