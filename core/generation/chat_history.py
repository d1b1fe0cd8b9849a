"""A conversation as a prompt: rendered by the model's chat template, and fitted
into the context window by dropping its oldest turns (chat(...,
history_policy="drop_oldest"), `tallow chat --drop-oldest-turns`).

System messages always stay, and so does the last message (the one being
answered). Otherwise messages go oldest first, and a dropped user message takes
the replies after it along, so the kept history still starts with a user turn
(many templates refuse anything else).
"""
from ..errors import ContextWindowError, Error


def chat_prompt_ids(model, messages, limit=None):
    """Token ids of a conversation rendered by the model's chat template, ready for a reply;
    None when they number more than `limit`. The template renders the whole conversation;
    its tokens are reused from earlier turns where the text between special tokens is
    unchanged (Tokenizer.encode_reusing), so a turn costs what its new text costs."""
    if model.tokenizer is None:
        raise Error("chat() needs a tokenizer with a chat template")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    reuse = getattr(model.tokenizer, "encode_reusing", None)
    if reuse is not None:
        return reuse(text, limit)
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    return None if limit is not None and len(ids) > limit else ids


def _turn_starts(messages):
    """(indices of the non-system messages, and where each shorter history starts among them):
    history k keeps the system messages and rest[starts[k]:]. Dropping a user message takes
    the replies after it along; the last message always stays."""
    rest = [i for i, m in enumerate(messages) if m.get("role") != "system"]
    starts = [0]
    while len(rest) - starts[-1] > 1:
        c = starts[-1] + 1
        while c < len(rest) - 1 and messages[rest[c]].get("role") != "user":
            c += 1
        starts.append(c)
    return rest, starts


def fit_history(model, messages, max_tokens):
    """(kept messages, their prompt ids): the longest recent history whose prompt
    leaves room for max_tokens new tokens in the context window. If even the
    system messages and the last message leave less room, they are kept and the
    reply stops when the window fills; if they leave none, ContextWindowError.

    Only a few histories are tried: dropping 1, 2, 4, 8... turns until one fits,
    then halving the gap (a prompt grows with the turns it keeps), each one counted
    only up to the room it may take."""
    window = model.context_window
    messages = list(messages)
    budget = max(window - max_tokens, 0)
    rest, starts = _turn_starts(messages)

    def history(k):
        first = rest[starts[k]] if rest else len(messages)
        return [m for i, m in enumerate(messages) if i >= first or m.get("role") == "system"]

    def fits(k):
        ids = chat_prompt_ids(model, history(k), limit=budget)
        return ids is not None, ids

    ok, ids = fits(0)
    if ok:
        return messages, ids
    last = len(starts) - 1
    low, step = 0, 1  # history `low` does not fit
    high = None
    while high is None and low < last:
        k = min(low + step, last)
        ok, found = fits(k)
        if ok:
            high, ids = k, found
        else:
            low, step = k, step * 2
    if high is None:  # even the system messages and the last message leave no room for max_tokens
        kept = history(last)
        ids = chat_prompt_ids(model, kept, limit=max(window - 1, 0))
        if ids is None:
            raise ContextWindowError(
                f"the system messages and the last message alone are more than {window - 1} tokens but "
                f"{model.config.source} has a context window of {window} positions, and the reply needs at "
                f"least one more: shorten the message or the system prompt")
        return kept, ids
    while high - low > 1:
        mid = (low + high) // 2
        ok, found = fits(mid)
        if ok:
            high, ids = mid, found
        else:
            low = mid
    return history(high), ids
