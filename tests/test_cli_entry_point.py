"""Every `tallow` subcommand's happy path, run the way a user runs it: the installed
`tallow` entry point (the console script pip wrote beside this Python), from a folder
outside the checkout, with the user's model cache.

tests/test_cli_errors.py covers the refusals; this file proves the commands work."""
import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_entry import entry_point

from tallow.io import write_safetensors

REPO = Path(__file__).resolve().parents[1]
JFK_TEXT = ("And so my fellow Americans ask not what your country can do for you, "
            "ask what you can do for your country.")


def run_cli(*args, cwd, env=None, stdin=None, timeout=600):
    """Run `tallow ARGS` as a subprocess (a hang fails the test instead of the run)."""
    return subprocess.run([entry_point(), *map(str, args)], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def ok(done):
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    return done


def test_version_and_help(tmp_path):
    assert ok(run_cli("--version", cwd=tmp_path)).stdout.startswith("tallow ")
    assert "transcribe" in ok(run_cli("--help", cwd=tmp_path)).stdout


def test_devices_lists_the_cpu(tmp_path):
    out = ok(run_cli("devices", cwd=tmp_path)).stdout
    assert out.startswith("cpu") and "available" in out.splitlines()[0]


def test_quantize_writes_a_gguf_that_loads(tmp_path):
    import gguf  # the reference reader (llama.cpp's own package), not tallow's
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((64, 256)).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    write_safetensors(tmp_path / "w.safetensors", weights)
    ok(run_cli("quantize", "--type", "q8_0", "w.safetensors", "w.gguf", cwd=tmp_path))
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "w.gguf").tensors}
    w = gguf.quants.dequantize(tensors["w"].data, tensors["w"].tensor_type).reshape(64, 256)
    assert tensors["w"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert np.abs(w - weights["w"]).max() < 0.05  # q8_0: within 1/254 of a 32-block's largest magnitude


def test_fetch_finds_the_cached_models(whisper_tiny_dir, smollm2_gguf, tmp_path):
    out = ok(run_cli("fetch", "--quiet", "whisper-tiny.en", "smollm2-135m-instruct", cwd=tmp_path)).stdout.split()
    assert out == [str(whisper_tiny_dir), str(smollm2_gguf)]
    ok(run_cli("fetch", "--verify", "whisper-tiny.en", cwd=tmp_path))
    assert "whisper-tiny.en" in ok(run_cli("fetch", "--list", cwd=tmp_path)).stdout


def test_transcribe_jfk(whisper_tiny_dir, jfk_wav, tmp_path):
    done = ok(run_cli("transcribe", jfk_wav, cwd=tmp_path))
    assert done.stdout.strip() == JFK_TEXT


def test_generate_and_chat(smollm2_gguf, tmp_path):
    done = ok(run_cli("generate", "The capital of France is", "--raw", "--max-tokens", "4", cwd=tmp_path))
    assert "Paris" in done.stdout
    done = ok(run_cli("chat", "--max-tokens", "8", cwd=tmp_path, stdin="What is the capital of France?\n"))
    assert done.stdout.strip()


def test_convert_a_ctranslate2_folder(whisper_tiny_dir, tallow_home, tmp_path):
    ct2 = tallow_home / "whisper-tiny.en-ct2"
    if not (ct2 / "model.bin").exists():
        pytest.skip(f"no CTranslate2 copy in the cache ({ct2}): `tallow fetch whisper-tiny.en` makes one")
    out = ok(run_cli("convert", "--quiet", ct2, tmp_path / "hf", cwd=tmp_path)).stdout.strip()
    assert Path(out) == tmp_path / "hf"
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["d_model"] == 384


def test_bench_prints_the_real_time_factor(whisper_tiny_dir, jfk_wav, tmp_path):
    done = ok(run_cli("bench", "--skip-llm", "--audio", jfk_wav, "--repeat", "1", "--json", cwd=tmp_path))
    report = json.loads(done.stdout)
    assert report, done.stdout


@pytest.mark.slow  # builds the whole site
def test_web_build_makes_a_site_a_plain_static_server_serves(tmp_path):
    ok(run_cli("web", "build", "--no-models", "--out", tmp_path / "site", cwd=tmp_path))
    site = tmp_path / "site"
    for name in ("index.html", "app.js", "worker.mjs", "worker.py", "pyodide/pyodide.mjs"):
        assert (site / name).is_file(), name
    assert list((site / "wheels").glob("tallow-*.whl"))
    plain = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(site)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = plain.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (http://127.0.0.1:N/) ..."
        port = int(line.split(" port ")[1].split()[0])
        status, body = _get(port, "/")
        assert status == 200 and b"<html" in body.lower()
    finally:
        plain.terminate()
        plain.wait(timeout=30)


def _get(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_web_serve_serves_the_demo_and_stops_on_ctrl_c(whisper_tiny_dir, smollm2_gguf, tmp_path):
    """The main job's last step: `tallow web serve` builds the site with the models and serves it."""
    site = tmp_path / "site"
    server = subprocess.Popen([entry_point(), "web", "serve", "--port", "0", "--out", str(site)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stdout:  # the build's progress, then "tallow demo: http://127.0.0.1:N/ ..."
            if line.startswith("tallow demo: "):
                break
        else:
            pytest.fail(f"tallow web serve ended (exit {server.wait()}): {server.stderr.read()[-2000:]}")
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        status, body = _get(port, "/")
        assert status == 200 and b"<html" in body.lower()
        status, body = _get(port, "/worker.mjs")
        assert status == 200 and b"pyodide" in body
        manifest = json.loads(_get(port, "/models/manifest.json")[1])
        files = [f for model in manifest["models"].values() for f in model["files"]]
        biggest = max(files, key=lambda f: f["size"])  # a weights file, or its first part when split
        url = biggest["parts"][0]["url"] if "parts" in biggest else biggest["url"]
        status, body = _get(port, "/" + url, headers={"Range": "bytes=0-3"})
        assert status == 206 and body == (b"GGUF" if ".gguf" in url else body[:4]) and len(body) == 4
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            assert server.wait(timeout=30) == 0
        finally:
            server.kill() if server.poll() is None else None
            server.stdout.close()
            server.stderr.close()


@pytest.mark.slow  # times every kernel family
def test_gpu_tune_then_show(tmp_path):
    """`tallow gpu tune` measures on this box's WebGPU adapter (lavapipe here) and `show` reads it back."""
    listed = ok(run_cli("devices", cwd=tmp_path)).stdout.splitlines()
    if not any(line.split()[:2] == ["wgpu", "available"] for line in listed):
        pytest.skip("no WebGPU adapter here (`tallow devices`)")
    env = dict(os.environ, TALLOW_HOME=str(tmp_path / "home"))
    assert "matmul f32" in ok(run_cli("gpu", "tune", "--family", "matmul f32", cwd=tmp_path, env=env)).stdout
    shown = json.loads(ok(run_cli("gpu", "show", "--json", cwd=tmp_path, env=env)).stdout)
    assert shown["families"]["matmul f32"]["choice"] in shown["families"]["matmul f32"]["seconds"]


def test_web_finds_the_checkout_from_the_package_folder_or_says_what_to_do(tmp_path, monkeypatch):
    import tallow
    from tallow.cli import web
    from tallow.errors import Error
    assert Path(web.web_dir()) == REPO / "web"  # the checkout this tallow is imported from
    installed = tmp_path / "site-packages" / "tallow"  # a wheel install: no web/ beside the package
    installed.mkdir(parents=True)
    monkeypatch.setattr(tallow, "__file__", str(installed / "__init__.py"))
    with pytest.raises(Error, match=r"needs a source checkout.*git clone .*pip install -e \."):
        web.web_dir()
