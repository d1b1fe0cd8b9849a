"""Drive a long-lived Pyodide (in Node) from CPython: the client side of run.mjs.

    runner = PyodideRunner()             # finds node and tests/pyodide/node_modules/pyodide
    runner.install_wheel("dist/tallow-0.1.0-py3-none-any.whl")
    runner.run("import tallow\\ntallow.__file__")   # -> "/lib/python3.14/site-packages/tallow/__init__.py"
    runner.close()

Python code inside Pyodide runs on Node's only thread and cannot be
interrupted, so every call has a time limit: past it the Node process is
killed, PyodideTimeout is raised, and the next call boots a fresh one (replaying
installed wheels and mounts). Nothing here needs pytest.
"""
import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER_SCRIPT = os.path.join(HERE, "run.mjs")
DEFAULT_PYODIDE_DIR = os.path.join(HERE, "node_modules", "pyodide")


class PyodideRunnerError(Exception):
    """The runner could not boot, crashed, or broke the protocol."""


class PyodideTimeout(PyodideRunnerError):
    """A call ran past its time limit; the Node process was killed."""


class PyodideCodeError(Exception):
    """The Python code raised inside Pyodide; the message holds its traceback."""

    def __init__(self, traceback_text, stdout="", stderr=""):
        super().__init__(traceback_text)
        self.traceback = traceback_text
        self.stdout = stdout
        self.stderr = stderr


def load_sibling(name):
    """Import tests/pyodide/<name>.py by path (tests/ is not a package), once."""
    import importlib.util
    key = f"tallow_tests_pyodide_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f"{name}.py"))
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


def find_node():
    return os.environ.get("TALLOW_NODE") or shutil.which("node")


def find_pyodide_dir():
    return os.path.abspath(os.environ.get("TALLOW_PYODIDE_DIR") or DEFAULT_PYODIDE_DIR)


def missing_requirements():
    """Why Pyodide tests cannot run here, or None when they can."""
    node = find_node()
    if not node:
        return "node is not on PATH (apt-get install nodejs npm), or set $TALLOW_NODE"
    pyodide_dir = find_pyodide_dir()
    if not os.path.exists(os.path.join(pyodide_dir, "pyodide.mjs")):
        return f"no Pyodide runtime at {pyodide_dir}: run scripts/pyodide_setup.sh"
    return None


class PyodideRunner:
    def __init__(self, node=None, pyodide_dir=None, boot_timeout=60.0):
        self.node = node or find_node()
        self.pyodide_dir = pyodide_dir or find_pyodide_dir()
        self.boot_timeout = boot_timeout
        self.info = None  # the ready line: boot_s, pyodide, python, stack_switching
        self.boots = 0
        self._setup = []  # (op, fields) replayed after a restart
        self._ids = itertools.count(1)
        self._proc = None
        self._lines = None
        self._stderr = None

    # ---- process --------------------------------------------------------
    def start(self):
        if self._proc is not None:
            return
        if self._stderr is not None:
            self._stderr.close()  # the previous (killed) process's log
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._proc = subprocess.Popen(
            [self.node, RUNNER_SCRIPT, self.pyodide_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )
        self._lines = queue.Queue()
        threading.Thread(target=_pump, args=(self._proc.stdout, self._lines), daemon=True).start()
        ready = self._next_line(self.boot_timeout, "boot")
        if not ready.get("ready"):
            self._kill()
            raise PyodideRunnerError(f"Pyodide did not boot: {ready.get('error')}")
        self.info = ready
        self.boots += 1
        for op, fields in self._setup:
            self._request(op, self.boot_timeout, fields)

    def close(self):
        if self._proc is None:
            return
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._kill()
        self._proc = None
        self._stderr.close()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- requests -------------------------------------------------------
    def call(self, code, timeout=30.0):
        """The whole reply for `code`: {ok, result, stdout, stderr, error}."""
        self.start()
        return self._request("run", timeout, {"code": code})

    def run(self, code, timeout=30.0):
        """The value of the code's last expression (JSON-decoded); raises PyodideCodeError."""
        reply = self.call(code, timeout)
        if not reply["ok"]:
            raise PyodideCodeError(reply["error"], reply.get("stdout", ""), reply.get("stderr", ""))
        return reply["result"]

    def install_wheel(self, path, timeout=60.0):
        """Unpack a pure-Python wheel into Pyodide's site-packages (again after each restart)."""
        fields = {"path": os.path.abspath(path)}
        self.start()
        reply = self._request("install_wheel", timeout, fields)
        if not reply["ok"]:
            raise PyodideRunnerError(f"installing {path} failed: {reply['error']}")
        self._setup.append(("install_wheel", fields))
        return reply["result"]

    def mount(self, host_dir, target, timeout=30.0):
        """Mount a host folder at `target` inside Pyodide (NODEFS), e.g. core/ as .../site-packages/tallow."""
        fields = {"host": os.path.abspath(host_dir), "target": target}
        self.start()
        reply = self._request("mount", timeout, fields)
        if not reply["ok"]:
            raise PyodideRunnerError(f"mounting {host_dir} failed: {reply['error']}")
        self._setup.append(("mount", fields))
        return reply["result"]

    def _request(self, op, timeout, fields):
        request_id = next(self._ids)
        line = json.dumps({"id": request_id, "op": op, **fields}) + "\n"
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except OSError as e:
            self._kill()
            raise PyodideRunnerError(f"the Pyodide process is gone ({e}){self._stderr_tail()}") from None
        reply = self._next_line(timeout, f"{op} request {request_id}")
        if reply.get("id") != request_id:
            self._kill()
            raise PyodideRunnerError(f"protocol error: expected a reply to {request_id}, got {reply}")
        return reply

    def _next_line(self, timeout, what):
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            tail = self._stderr_tail()
            self._kill()
            raise PyodideTimeout(f"{what} took more than {timeout:g} s: the Pyodide process was killed "
                                 f"(the next call boots a fresh one){tail}") from None
        if line is None:
            code = self._proc.wait()
            tail = self._stderr_tail()
            self._kill()
            raise PyodideRunnerError(f"the Pyodide process exited (status {code}) during {what}{tail}")
        try:
            return json.loads(line)
        except ValueError:
            self._kill()
            raise PyodideRunnerError(f"protocol error during {what}: not JSON: {line[:200]!r}") from None

    def _kill(self):
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _stderr_tail(self, limit=2000):
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")[-limit:]
        self._stderr.seek(0, os.SEEK_END)
        return f"\n--- node stderr ---\n{text}" if text.strip() else ""


def _pump(stream, lines):
    for raw in stream:
        lines.put(raw.decode(errors="replace"))
    lines.put(None)


# ---- building the wheel under test ---------------------------------------
def build_wheel(out_dir, repo_root=REPO_ROOT):
    """Build the tallow wheel from a copy of the source (so a shared working tree
    gets no build/ or egg-info churn) and return (wheel path, source copy). With
    $TALLOW_WHEEL naming a prebuilt wheel, that is used and the source is repo_root."""
    prebuilt = os.environ.get("TALLOW_WHEEL")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise PyodideRunnerError(f"$TALLOW_WHEEL={prebuilt} is not a file")
        return prebuilt, repo_root
    source = os.path.join(out_dir, "source")
    _copy_project(repo_root, source)
    command = [sys.executable, "-m", "pip", "wheel", source, "--no-deps", "-q", "-w", out_dir]
    if _have_build_requirements():
        command.append("--no-build-isolation")  # offline and fast; otherwise pip fetches setuptools
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise PyodideRunnerError(f"building the wheel failed:\n{done.stdout}\n{done.stderr}")
    wheels = [f for f in os.listdir(out_dir) if f.startswith("tallow-") and f.endswith(".whl")]
    if len(wheels) != 1:
        raise PyodideRunnerError(f"expected one tallow wheel in {out_dir}, found {wheels}")
    return os.path.join(out_dir, wheels[0]), source


def python_modules(source_root):
    """Every module (dotted name) the packages mapped in source_root's pyproject.toml hold."""
    names = []
    for package, folder in package_dirs(source_root).items():
        top = os.path.join(source_root, folder)
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            prefix = ".".join([package] + [p for p in os.path.relpath(root, top).split(os.sep) if p != "."])
            names += [prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}" for f in files if f.endswith(".py")]
    return sorted(names)


def _copy_project(repo_root, dest):
    """pyproject.toml, the top-level metadata files and the package folders it maps."""
    os.makedirs(dest)
    for name in os.listdir(repo_root):
        path = os.path.join(repo_root, name)
        if os.path.isfile(path) and (name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in")
                                     or name.upper().startswith(("README", "LICENSE"))):
            shutil.copy2(path, dest)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", "*.egg-info")
    for folder in sorted(set(package_dirs(repo_root).values())):
        shutil.copytree(os.path.join(repo_root, folder), os.path.join(dest, folder), ignore=skip)


def package_dirs(repo_root=REPO_ROOT):
    """{import name: folder} from pyproject's [tool.setuptools] package-dir, e.g. {"tallow": "core"}."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(os.path.join(repo_root, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {name: folder for name, folder in mapping.items() if os.path.isdir(os.path.join(repo_root, folder))}


def _have_build_requirements():
    from importlib import metadata
    try:
        setuptools_major = int(metadata.version("setuptools").split(".")[0])
        metadata.version("wheel")
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return setuptools_major >= 68
