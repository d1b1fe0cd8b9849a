"""Whisper's timestamp tokens <|0.00|> .. <|30.00|> (0.02 s apart).

openai-whisper numbers them right after <|notimestamps|>, and Hugging Face's
tokenizer.json for most checkpoints does not list them, so the `tokenizers`
library silently drops those ids. tallow decodes them the same way by default,
and renders them as "<|1.02|>" with decode_with_timestamps=True, as
transformers' WhisperTokenizer.decode does (the text between two timestamps
decoded on its own).
"""
TIME_PRECISION = 0.02
COUNT = 1501  # 0.00 .. 30.00


def timestamp_begin(impl):
    """The id of <|0.00|> when it follows <|notimestamps|> without being a vocabulary token
    (so only decode knows it); None for every other tokenizer."""
    no_timestamps = impl.token_to_id("<|notimestamps|>")
    if no_timestamps is None or impl.id_to_token(no_timestamps + 1) is not None:
        return None
    return no_timestamps + 1


def decode(decode_plain, ids, begin, with_timestamps):
    """Text of ids holding timestamp ids in [begin, begin + COUNT); decode_plain(ids) decodes the rest."""
    if not with_timestamps:
        return decode_plain([i for i in ids if not begin <= i < begin + COUNT])
    parts, run = [], []
    for i in ids:
        if begin <= i < begin + COUNT:
            parts += [decode_plain(run), f"<|{(i - begin) * TIME_PRECISION:.2f}|>"]
            run = []
        else:
            run.append(i)
    parts.append(decode_plain(run))
    return "".join(parts)
