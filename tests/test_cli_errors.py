"""Every subcommand answers bad input with one line on stderr and exit status 2.

Each case runs `python -m tallow ...` in a subprocess, as a user would, against the
tree under test. All of them fail before a model would load, so the table is fast."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow.io import write_safetensors

JFK = Path(__file__).parent / "data" / "jfk.wav"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    weights = root / "w.safetensors"
    write_safetensors(weights, {"w": np.ones((4, 32), np.float32)})
    (root / "folder").mkdir()
    (root / "not-a-folder").write_text("x")
    os.symlink(weights, root / "link.safetensors")
    os.link(weights, root / "hard.safetensors")
    return root


def run_tallow(args, home):
    package_parent = os.path.dirname(os.path.dirname(tallow.__file__))  # import this tree's tallow
    env = dict(os.environ, TALLOW_HOME=str(home),
               PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "tallow", *args], env=env, capture_output=True, text=True, timeout=60)


# (arguments with {d} for the test folder, TALLOW_HOME below {d}, what the line must say)
CASES = [
    (["frobnicate"], "home", "invalid choice: 'frobnicate'"),
    (["devices", "--colour"], "home", "unrecognized arguments: --colour"),
    (["fetch", "no-such-model"], "home", "don't know 'no-such-model'"),
    (["fetch", "--verify"], "home", "need the names"),
    (["fetch", "--verify", "jfk.wav"], "home", "not fetched"),
    (["fetch", "jfk.wav"], "not-a-folder", "$TALLOW_HOME, default ~/.cache/tallow) is a file"),
    (["generate", "hi"], "not-a-folder", "$TALLOW_HOME, default ~/.cache/tallow) is a file"),
    (["generate"], "home", "the following arguments are required: prompt"),
    (["generate", "hi", "--temperature", "-1"], "home", "argument --temperature: -1 must be >= 0"),
    (["generate", "hi", "--temperature", "nan"], "home", "'nan' is not a finite number"),
    (["generate", "hi", "--top-p", "0"], "home", "argument --top-p: 0 must be in (0, 1]"),
    (["generate", "hi", "--top-k", "-2"], "home", "argument --top-k: -2 must be >= 0"),
    (["generate", "hi", "--max-tokens", "-1"], "home", "argument --max-tokens: -1 must be >= 1"),
    (["generate", "hi", "--max-tokens", "ten"], "home", "'ten' is not an integer"),
    (["generate", "hi", "--model", "{d}/missing.gguf"], "home", "missing.gguf"),
    (["chat", "--temperature", "inf"], "home", "'inf' is not a finite number"),
    (["chat", "--min-p", "2"], "home", "argument --min-p: 2 must be in [0, 1]"),
    (["transcribe"], "home", "the following arguments are required: audio"),
    (["transcribe", "{d}/missing.wav"], "home", "missing.wav: no such audio file"),
    (["transcribe", str(JFK), "--beam-size", "0"], "home", "argument --beam-size: 0 must be from 1 to 16"),
    (["transcribe", str(JFK), "--beam-size", "100000"], "home", "argument --beam-size: 100000 must be from 1 to 16"),
    (["transcribe", str(JFK), "--output", "{d}/folder"], "home", "is a directory"),
    (["transcribe", str(JFK), "--output", str(JFK)], "home", "is the input file"),
    (["transcribe", str(JFK), "--output", "{d}/nowhere/out.txt"], "home", "does not exist"),
    (["transcribe", str(JFK), str(JFK.parent / "*.wav")], "home", "many inputs need --output-dir"),
    (["transcribe", str(JFK), "-d", "{d}/out", "-o", "{d}/a.txt"], "home", "for many inputs give --output-dir"),
    (["transcribe", str(JFK), "-d", "{d}/not-a-folder"], "home", "is a file, not a folder"),
    (["transcribe", "{d}/folder", "-d", "{d}/out"], "home", "the folder holds no audio file"),
    (["transcribe", str(JFK), "--quantize", "q4"], "home", "cannot quantise the weights to 'q4'; choices: q8_0"),
    (["transcribe", "{d}/folder", "-d", "{d}/out", "--quantize", "int8"], "home", "choices: q8_0"),
    (["transcribe", "{d}/nothing-*.wav", "-d", "{d}/out"], "home", "the pattern matches no file"),
    (["transcribe", "--manifest", "{d}/missing.list", "-d", "{d}/out"], "home", "cannot read the manifest"),
    (["transcribe", "--manifest", "{d}/not-a-folder", "-d", "{d}/out"], "home", "line 1: x: no such audio file"),
    (["transcribe", str(JFK), "-d", "{d}/out", "--workers", "0"], "home", "--workers/-j: 0 must be >= 1"),
    (["transcribe", str(JFK), "-d", "{d}/out", "--workers", "100000"], "home", "--workers 100000: this machine has"),
    (["quantize", "{d}/w.safetensors", "{d}/w.safetensors"], "home", "is the input file"),
    (["quantize", "{d}/w.safetensors", "{d}/../{d_name}/w.safetensors"], "home", "is the input file"),
    (["quantize", "{d}/w.safetensors", "{d}/link.safetensors"], "home", "is the input file"),
    (["quantize", "{d}/w.safetensors", "{d}/hard.safetensors"], "home", "is the input file"),
    (["quantize", "{d}/w.safetensors", "{d}/folder"], "home", "is a directory"),
    (["quantize", "{d}/missing.safetensors", "{d}/out.gguf"], "home", "missing.safetensors"),
    (["quantize", "{d}/w.safetensors", "{d}/out.gguf", "--type", "q9"], "home", "argument --type: invalid choice"),
    (["bench", "--tokens", "0"], "home", "argument --tokens: 0 must be >= 1"),
    (["web", "serve", "--port", "70000"], "home", "70000 is not a TCP port"),
    (["web", "serve", "--port", "-1"], "home", "-1 is not a TCP port"),
    (["web", "deploy"], "home", "invalid choice: 'deploy'"),
]


@pytest.fixture(scope="module")
def outcomes(files):
    """Every case run once, four at a time (each is a fresh interpreter: mostly start-up)."""
    before = (files / "w.safetensors").read_bytes()
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: run_tallow([a.format(d=files, d_name=files.name) for a in case[0]],
                                                     files / case[1]), CASES))
    return before, done


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line_and_status_2(files, outcomes, index):
    before, results = outcomes
    done, says = results[index], CASES[index][2]
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("tallow") and ": error: " in lines[0], done.stderr
    assert says in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""
    assert (files / "w.safetensors").read_bytes() == before  # the input of a refused quantize is intact
