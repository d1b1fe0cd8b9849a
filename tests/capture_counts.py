"""Counting a backend's captures and replays (tests/test_capture.py, test_whisper_capture.py)."""

EMULATED = ("cuda-emulator", "metal-emulator")  # conftest.CAPTURING_DEVICES on the CPU emulators


def is_emulated(request):
    """Whether the test runs on a CPU emulator (slow: tests take fewer steps there)."""
    return request.node.callspec.params.get("capture_device") in EMULATED


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
