"""tokenizer.json post-processors: the special ids wrapped around one encoded text."""
from ..errors import FormatError


def _template(spec, token_to_id):
    special = spec.get("special_tokens", {})
    pieces = []  # list of lists of ids, or None for "the sequence itself"
    for item in spec.get("single", []):
        if "Sequence" in item:
            pieces.append(None)
        elif "SpecialToken" in item:
            name = item["SpecialToken"]["id"]
            if name in special:
                ids = list(special[name]["ids"])
            else:
                tid = token_to_id(name)
                if tid is None:
                    raise FormatError(f"TemplateProcessing special token {name!r} is not in the vocabulary")
                ids = [tid]
            pieces.append(ids)
        else:
            raise FormatError(f"TemplateProcessing item {item!r} is not understood")

    def run(ids):
        out = []
        for p in pieces:
            out.extend(ids if p is None else p)
        return out
    return run


def _wrap(cls_key, sep_key):
    def make(spec, _token_to_id):
        cls_id = spec[cls_key][1]
        sep_id = spec[sep_key][1]
        return lambda ids: [cls_id, *ids, sep_id]
    return make


_BUILDERS = {
    "TemplateProcessing": _template,
    "BertProcessing": _wrap("cls", "sep"),
    "RobertaProcessing": _wrap("cls", "sep"),
    "ByteLevel": lambda spec, t2i: None,  # only adjusts offsets
}


def build(spec, token_to_id):
    """tokenizer.json "post_processor" object (or None) -> function(ids) -> ids, or None."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [build(s, token_to_id) for s in spec["processors"]]
        steps = [s for s in steps if s is not None]

        def run(ids):
            for step in steps:
                ids = step(ids)
            return ids
        return run
    if kind not in _BUILDERS:
        raise FormatError(f"tokenizer post_processor type {kind!r} is not supported by tallow's pure-Python tokenizer")
    return _BUILDERS[kind](spec, token_to_id)
