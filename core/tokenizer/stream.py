"""Incremental decoding for streaming generation.

Decodes a short window of recent ids and emits only the text that the newest
id completed; text ending in U+FFFD (an unfinished UTF-8 character) waits for
the next id. The prefix kept in the window lets decoders that treat the first
token specially (leading-space stripping) behave as in a full decode.
"""


class StreamDecoder:
    def __init__(self, tokenizer, skip_special_tokens=False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = []    # the window: already-emitted context, then pending ids
        self._read = 0    # ids before this index have been emitted

    def _decode(self, ids):
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def step(self, token_id):
        """Feed one id; return the newly completed text ('' if none yet)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[:self._read])
        new_text = self._decode(self._ids)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            # Keep only the ids just emitted as context for the next step.
            self._ids = self._ids[self._read:]
            self._read = len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self):
        """Return whatever is still held (an unfinished character decodes to U+FFFD) and reset."""
        prefix_text = self._decode(self._ids[:self._read])
        new_text = self._decode(self._ids)
        self._ids = []
        self._read = 0
        return new_text[len(prefix_text):]
