"""Whisper's special tokens, looked up in the model's own tokenizer.

English-only and multilingual checkpoints number them differently (and
large-v3 has one more language), so nothing here is hard-coded by id: ids come
from the tokenizer's added tokens, and the timestamp tokens follow
<|notimestamps|> up to the end of the vocabulary, as in openai-whisper.
"""
import re

from ..errors import FormatError

_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")
# Tokens to suppress: openai-whisper's Tokenizer.non_speech_tokens, for checkpoints whose
# config has no suppress_tokens list (speaker tags, music symbols, brackets).
_NON_SPEECH_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + \
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
_MISC_SYMBOLS = "♩♪♫♬♭♮♯"


class WhisperTokens:
    """Ids of the special tokens: eot, sot, sot_prev, sot_lm, transcribe, translate,
    no_speech, no_timestamps, timestamp_begin; languages {code: id}."""

    def __init__(self, tokenizer, vocab_size, source="tokenizer.json"):
        self.tokenizer = tokenizer
        ids = {}
        for name, candidates in (("eot", ("<|endoftext|>",)), ("sot", ("<|startoftranscript|>",)),
                                 ("sot_prev", ("<|startofprev|>",)), ("sot_lm", ("<|startoflm|>",)),
                                 ("transcribe", ("<|transcribe|>",)), ("translate", ("<|translate|>",)),
                                 ("no_speech", ("<|nospeech|>", "<|nocaptions|>")),
                                 ("no_timestamps", ("<|notimestamps|>",))):
            ids[name] = next((i for i in map(tokenizer.token_to_id, candidates) if i is not None), None)
        missing = [n for n in ("eot", "sot", "no_timestamps") if ids[n] is None]
        if missing:
            raise FormatError(f"{source}: not a Whisper tokenizer (no special token for {', '.join(missing)})")
        self.__dict__.update(ids)
        self.timestamp_begin = self.no_timestamps + 1
        self.vocab_size = vocab_size
        if self.timestamp_begin >= vocab_size:
            raise FormatError(f"{source}: <|notimestamps|> is id {self.no_timestamps}, "
                              f"so the vocabulary of {vocab_size} has no room for timestamp tokens")
        self.languages = {}
        upper = self.translate if self.translate is not None else self.no_timestamps
        for token_id in range(self.sot + 1, upper):
            m = _LANGUAGE_TOKEN.match(tokenizer.id_to_token(token_id) or "")
            if m:
                self.languages[m.group(1)] = token_id

    @property
    def is_multilingual(self):
        # openai-whisper's rule: English-only checkpoints have 51864 tokens, multilingual ones more.
        return self.vocab_size >= 51865

    def language_token(self, code):
        if code not in self.languages:
            known = ", ".join(sorted(self.languages))
            raise FormatError(f"unknown language {code!r} for this model; known codes: {known}")
        return self.languages[code]

    def language_of(self, token_id):
        return next((c for c, i in self.languages.items() if i == token_id), None)

    def sot_sequence(self, language, task):
        """The start of every decode: <|startoftranscript|> [<|lang|> <|task|>]."""
        seq = [self.sot]
        if self.is_multilingual:
            seq.append(self.language_token(language or "en"))
            task_id = self.translate if task == "translate" else self.transcribe
            if task_id is not None:
                seq.append(task_id)
        return seq

    def non_speech_tokens(self):
        encode = self.tokenizer.encode
        result = set()
        for text in (" -", " '"):
            ids = encode(text, add_special_tokens=False)
            if ids:
                result.add(ids[0])
        for symbol in _NON_SPEECH_SYMBOLS + list(_MISC_SYMBOLS):
            for ids in (encode(symbol, add_special_tokens=False), encode(" " + symbol, add_special_tokens=False)):
                if ids and (len(ids) == 1 or symbol in _MISC_SYMBOLS):
                    result.add(ids[0])
        return sorted(result)

    def decode_text(self, ids):
        """Text of the ordinary tokens (special and timestamp tokens dropped)."""
        return self.tokenizer.decode([i for i in ids if i < self.eot])
