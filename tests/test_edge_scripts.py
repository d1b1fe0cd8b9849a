"""The edge scripts run end to end as subprocesses on tests/data/jfk.wav with the real
fetched models (Whisper tiny.en, SmolLM2-135M Q4_1), on the best device here, and fail
with one clear line (exit status 2, no traceback) when a device or input is missing.
The models come from tallow's cache ($TALLOW_HOME; `tallow fetch whisper-tiny.en
smollm2-135m-instruct`); without them these tests skip with that reason."""
import os
import subprocess
import sys

import pytest

import tallow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDGE = os.path.join(ROOT, "edge")
JFK = os.path.join(ROOT, "tests", "data", "jfk.wav")
WHISPER, LLM = "whisper-tiny.en", "smollm2-135m-instruct"
EXPECTED = "ask not what your country can do for you"

pytestmark = pytest.mark.slow


def _need(*names):
    from tallow import hub
    for name in names:
        if not (hub.model_dir(name) / hub.MARKER).exists() and not any(hub.model_dir(name).glob("*")):
            pytest.skip(f"model {name} is not in the cache {hub.home()}: run `tallow fetch {name}`")


def run_script(script, *args, timeout=240):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TALLOW_DEVICE", None)
    proc = subprocess.run([sys.executable, os.path.join(EDGE, script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    return proc


def _clean_failure(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    for w in words:
        assert w in line, line
    return line


def test_live_transcription_streams_partials_then_the_final_text():
    _need(WHISPER)
    proc = run_script("live_transcribe.py", "--wav", JFK, "--chunk-seconds", "1", "--step", "6")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    partials = [ln for ln in lines if ln.startswith("... ")]
    finals = [ln for ln in lines if ln.startswith("> ")]
    assert len(partials) == 1 and len(finals) == 1, lines  # a partial at 6 s, the final at the end (11 s)
    assert partials[0].lower().startswith("... and so my fellow americans")
    assert EXPECTED in finals[0].lower().replace(",", "")
    assert "peak RSS" in proc.stderr


def test_voice_assistant_answers_a_spoken_question():
    _need(WHISPER, LLM)
    proc = run_script("voice_assistant.py", "--wav", JFK, "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("you: ") and EXPECTED in out.splitlines()[0].lower().replace(",", "")
    reply = out.split("assistant: ", 1)[1].strip()
    assert len(reply.split()) >= 3, out  # a real reply of up to 16 tokens
    assert "tokens at" in proc.stderr


def test_transcription_service_writes_txt_and_srt_once(tmp_path):
    _need(WHISPER)
    audio = tmp_path / "meeting.wav"
    audio.write_bytes(open(JFK, "rb").read())
    os.utime(audio, (1_000_000_000, 1_000_000_000))  # settled long ago
    (tmp_path / "notes.md").write_text("not audio")
    proc = run_script("transcribe_service.py", "--watch", str(tmp_path), "--once", "--settle", "0")
    assert proc.returncode == 0, proc.stderr
    txt, srt = (tmp_path / "meeting.txt").read_text(), (tmp_path / "meeting.srt").read_text()
    assert EXPECTED in txt.lower().replace(",", "")
    assert srt.startswith("1\n00:00:00,000 --> ") and EXPECTED.split()[0] in srt.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meeting.srt", "meeting.txt", "meeting.wav", "notes.md"]
    # a second pass finds nothing new: no model run, outputs untouched
    before = (tmp_path / "meeting.txt").stat().st_mtime_ns
    again = run_script("transcribe_service.py", "--watch", str(tmp_path), "--once", "--settle", "0")
    assert again.returncode == 0 and again.stdout == "" and (tmp_path / "meeting.txt").stat().st_mtime_ns == before


def test_transcription_service_skips_a_wav_with_an_absurd_sample_rate(tmp_path):
    """A header claiming 999,999,937 Hz once hung the service building filter taps; now that
    file gets one error line and the next file is transcribed."""
    import struct
    _need(WHISPER)
    fmt = struct.pack("<HHIIHH", 1, 1, 999_999_937, 1_999_999_874, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", 32000) + bytes(32000)
    (tmp_path / "a-bad.wav").write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    (tmp_path / "b-good.wav").write_bytes(open(JFK, "rb").read())
    for name in ("a-bad.wav", "b-good.wav"):
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))
    proc = run_script("transcribe_service.py", "--watch", str(tmp_path), "--once", "--settle", "0", timeout=120)
    assert proc.returncode == 1, proc.stderr  # one file failed
    assert "a-bad.wav: error: " in proc.stderr and "999999937 Hz" in proc.stderr and "1000-768000 Hz" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert EXPECTED in (tmp_path / "b-good.txt").read_text().lower().replace(",", "")
    assert not (tmp_path / "a-bad.txt").exists()


def test_bench_reports_real_time_factor_and_tokens_per_second():
    _need(WHISPER, LLM)
    code = ("import sys\nfrom tallow import cli\n"
            "if 'bench' in cli.SUBCOMMANDS:\n    sys.exit(cli.main(sys.argv[1:]))\n"
            "import argparse\nfrom tallow.cli import bench as cli_bench\np = argparse.ArgumentParser(prog='tallow bench')\n"
            "cli_bench.add_arguments(p)\nargs = p.parse_args(sys.argv[2:])\n"
            "sys.exit(cli._guarded('bench', lambda: cli_bench.run(args)))\n")
    proc = subprocess.run([sys.executable, "-c", code, "bench", "--tokens", "8", "--audio", JFK, "--json"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    import json
    report = json.loads(proc.stdout)
    assert report["device"] == str(tallow.default_device())
    w, g = report["whisper"], report["llm"]
    assert w["audio_seconds"] == pytest.approx(11.0, abs=0.1) and w["real_time_factor"] > 0
    assert EXPECTED in w["text"].lower().replace(",", "")
    assert g["generated_tokens"] >= 1 and g["prefill_tokens_per_second"] > 0 and g["prompt_tokens"] > 5
    assert report["peak_rss_mb"] > 50

    bad = subprocess.run([sys.executable, "-c", code, "bench", "--device", "cuda"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    if not _has("cuda"):
        line = _clean_failure(bad, "cuda")
        assert "cupy" in line or "CUDA" in line


def _has(name):
    try:
        tallow.Device(name)
        return True
    except tallow.DeviceError:
        return False


@pytest.mark.parametrize("script,extra", [("live_transcribe.py", ["--wav", JFK]), ("voice_assistant.py", ["--wav", JFK]),
                                          ("transcribe_service.py", ["--watch", ROOT, "--once"])])
@pytest.mark.parametrize("device", ["cuda", "metal"])
def test_missing_device_is_one_clear_line(script, extra, device):
    if _has(device):
        pytest.skip(f"{device} is available here")
    proc = run_script(script, "--device", device, *extra, timeout=60)
    line = _clean_failure(proc, f"device {device!r} is not available")
    assert {"cuda": "cupy", "metal": "macOS"}[device] in line


def test_missing_inputs_are_clear():
    proc = run_script("live_transcribe.py", "--wav", "/no/such.wav", timeout=60)
    _clean_failure(proc, "/no/such.wav")
    proc = run_script("transcribe_service.py", "--watch", "/no/such/folder", "--once", timeout=60)
    _clean_failure(proc, "/no/such/folder")


def test_microphone_without_sounddevice_or_arecord_is_clear(tmp_path):
    """No --wav, no sounddevice and no arecord on PATH: the message says what to install."""
    try:
        import sounddevice  # noqa: F401
        pytest.skip("sounddevice is installed here")
    except (ImportError, OSError):
        pass
    env = dict(os.environ, PATH=str(tmp_path))  # an empty PATH: no arecord
    proc = subprocess.run([sys.executable, os.path.join(EDGE, "live_transcribe.py"), "--max-seconds", "1"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    _clean_failure(proc, "sounddevice", "arecord", "--wav")
