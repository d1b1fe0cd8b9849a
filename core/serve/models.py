"""The models a server holds: loaded once at start, each with its own Worker.

A --model value is a known name (`smollm2-135m-instruct`), a path (a .gguf file, a
Hugging Face-layout folder), or ID=NAME_OR_PATH to choose the id clients send as `model`.
Without ID= the id is the name, or a path's file name without .gguf.
"""
import os
import time

from ..errors import Error
from .errors import ApiError, bad_request
from .workers import BatchWorker, Worker

KINDS = {"llm": "a language model", "whisper": "a Whisper speech model"}


def model_id(spec):
    """(id, name or path) of a --model value."""
    if "=" in spec and not os.path.exists(spec):
        served, _, source = spec.partition("=")
        if not served or not source:
            raise Error(f"--model {spec!r}: ID=NAME_OR_PATH needs both an id and a model")
        return served, source
    base = os.path.basename(os.path.normpath(spec)) if os.path.exists(spec) else spec
    return (base[:-5] if base.endswith(".gguf") else base), spec


class ServedModel:
    def __init__(self, id, model, max_queue, max_batch=1):
        self.id, self.model = id, model
        self.kind = getattr(model, "kind", None)
        self.created = int(time.time())
        # a language model decodes up to max_batch requests together; Whisper runs one at a time
        self.worker = BatchWorker(id, max_queue, model, max_batch) if self.kind == "llm" else Worker(id, max_queue)

    def card(self):
        """The /v1/models entry."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "tallow"}


class ServedModels:
    def __init__(self, served):
        self.by_id = {m.id: m for m in served}

    @classmethod
    def load(cls, specs, device=None, max_queue=16, log=None, max_batch=8):
        """Load each --model value once (a known name is fetched on first use)."""
        from ..models import load_model
        served = []
        for spec in specs:
            served_id, source = model_id(spec)
            if any(m.id == served_id for m in served):
                raise Error(f"--model {spec!r}: the id {served_id!r} is given twice; name one ID=PATH")
            start = time.perf_counter()
            model = load_model(source, device=device)
            kind = getattr(model, "kind", None)
            if kind not in KINDS:
                raise Error(f"--model {spec!r} is neither a language model nor a Whisper model")
            if kind == "llm" and getattr(model, "tokenizer", None) is None:
                raise Error(f"--model {spec!r} has no tokenizer, so it cannot serve text")
            served.append(ServedModel(served_id, model, max_queue, max_batch))
            if log:
                log(f"loaded {served_id} ({KINDS[kind]}) in {time.perf_counter() - start:.1f} s")
        return cls(served)

    def get(self, requested, kind, param="model"):
        """The model a request names (or the only one of its kind when it names none)."""
        of_kind = [m for m in self.by_id.values() if m.kind == kind]
        if requested is None:
            if len(of_kind) == 1:
                return of_kind[0]
            raise bad_request(f"name the model: this server has {len(of_kind)} {KINDS[kind]}s "
                              f"({', '.join(m.id for m in of_kind) or 'none'})", param=param)
        if not isinstance(requested, str):
            raise bad_request("'model' must be a string", param=param)
        found = self.by_id.get(requested)
        if found is None or found.kind != kind:
            offered = ", ".join(m.id for m in of_kind) or "none"
            what = "does not exist" if found is None else f"is not {KINDS[kind]}"
            raise ApiError(404, f"The model '{requested}' {what} on this server (serving {KINDS[kind]}s: {offered})",
                           param=param, code="model_not_found")
        return found

    def health(self):
        """Each model's worker: running or not, requests waiting, the most it decodes together
        (max_batch) and counts since start (a language model's: peak_batch too)."""
        return [{"id": m.id, "kind": m.kind, "running": m.worker.running, "waiting": m.worker.waiting,
                 "max_batch": m.worker.max_batch, **m.worker.stats} for m in self.by_id.values()]

    def cards(self):
        return [m.card() for m in self.by_id.values()]

    def stop(self):
        for m in self.by_id.values():
            m.worker.stop()
