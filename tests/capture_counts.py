"""Counting a backend's captures and replays (tests/test_capture.py, test_whisper_capture.py)."""


def count_captures(monkeypatch, backend):
    """{"capture": n, "replay": m}, kept up to date as the backend begins captures and replays."""
    calls = {"capture": 0, "replay": 0}
    begin, replay = backend.begin_capture, backend.replay

    def counted_begin(*a):
        calls["capture"] += 1
        return begin(*a)

    def counted_replay(*a):
        calls["replay"] += 1
        return replay(*a)
    monkeypatch.setattr(backend, "begin_capture", counted_begin)
    monkeypatch.setattr(backend, "replay", counted_replay)
    return calls
