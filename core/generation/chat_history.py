"""A conversation as a prompt: rendered by the model's chat template, and fitted
into the context window by dropping its oldest turns (chat(...,
history_policy="drop_oldest"), `tallow chat --drop-oldest-turns`).

System messages always stay, and so does the last message (the one being
answered). Otherwise messages go oldest first, and a dropped user message takes
the replies after it along, so the kept history still starts with a user turn
(many templates refuse anything else).
"""
from ..errors import ContextWindowError, Error


def chat_prompt_ids(model, messages):
    """Token ids of a conversation rendered by the model's chat template, ready for a reply."""
    if model.tokenizer is None:
        raise Error("chat() needs a tokenizer with a chat template")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special_tokens=False)


def _drop_oldest_turn(messages):
    """messages without its oldest non-system turn, or None when only the last message is left to drop."""
    rest = [i for i, m in enumerate(messages) if m.get("role") != "system"]
    if len(rest) <= 1:
        return None
    drop = {rest[0]}
    for i in rest[1:-1]:  # the replies that belonged to the dropped message
        if messages[i].get("role") == "user":
            break
        drop.add(i)
    return [m for i, m in enumerate(messages) if i not in drop]


def fit_history(model, messages, max_tokens):
    """(kept messages, their prompt ids): the longest recent history whose prompt
    leaves room for max_tokens new tokens in the context window. If even the
    system messages and the last message leave less room, they are kept and the
    reply stops when the window fills; if they leave none, ContextWindowError."""
    window = model.context_window
    messages = list(messages)
    while True:
        ids = chat_prompt_ids(model, messages)
        if len(ids) + max_tokens <= window:
            return messages, ids
        shorter = _drop_oldest_turn(messages)
        if shorter is None:
            if len(ids) >= window:
                raise ContextWindowError(
                    f"the system messages and the last message alone are {len(ids)} tokens but "
                    f"{model.config.source} has a context window of {window} positions, and the reply needs at "
                    f"least one more: shorten the message or the system prompt")
            return messages, ids
        messages = shorter
