"""Make llama-cpp-python importable for the benches that compare against llama.cpp.

It has no wheel for most platforms on PyPI, so the first run builds one from the
sdist (about 15 minutes on 2 cores; needs cmake and a C++ compiler) into
$TALLOW_HOME/wheels, and every later run installs that cached wheel in seconds.
"""
import glob
import os
import platform
import subprocess
import sys

VERSION = "0.3.36"  # the version measured in docs/performance.md
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
              "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF")
# x86: no AMX. -march=native turns it on where cpuid lists it, but a virtual machine may list AMX
# without letting a process use its tile state: ggml's AMX product then dies of SIGILL on the
# first prompt (seen on a Sapphire Rapids VM). gcc's explicit -mno-* flags win over -march.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BUILD = "noamx"  # names the cached wheel's folder: a wheel built with other flags is never reused


def wheel_dir():
    home = os.environ.get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")
    return os.path.join(home, "wheels", f"llama-cpp-{BUILD}")


def cmake_args():
    if platform.machine().lower() in ("x86_64", "amd64"):
        return CMAKE_ARGS + f' "-DCMAKE_C_FLAGS={NO_AMX}" "-DCMAKE_CXX_FLAGS={NO_AMX}"'
    return CMAKE_ARGS


def _pip(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True)


def ensure_llama_cpp(build=True):
    """None when llama_cpp imports (installing the cached or freshly built wheel first);
    else the reason it is not available."""
    try:
        import llama_cpp  # noqa: F401
        return None
    except ImportError:
        pass
    folder = wheel_dir()
    wheels = sorted(glob.glob(os.path.join(folder, f"llama_cpp_python-{VERSION}-*.whl")))
    if not wheels:
        if not build:
            return "llama-cpp-python is not installed and no cached wheel is in " + folder
        os.makedirs(folder, exist_ok=True)
        print(f"building llama-cpp-python {VERSION} from source into {folder} "
              "(once; about 15 minutes on 2 cores)...", file=sys.stderr, flush=True)
        env = dict(os.environ, CMAKE_ARGS=cmake_args(), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
        # --no-cache-dir: pip's cache keys a built wheel on the sdist alone, not on CMAKE_ARGS
        done = _pip("wheel", f"llama-cpp-python=={VERSION}", "--no-deps", "--no-binary", "llama-cpp-python",
                    "--no-cache-dir", "-w", folder, env=env)
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"building llama-cpp-python failed ({tail}); it needs cmake and a C++ compiler"
        wheels = sorted(glob.glob(os.path.join(folder, f"llama_cpp_python-{VERSION}-*.whl")))
    done = _pip("install", "-q", "--no-deps", wheels[-1])
    if done.returncode:
        return f"installing {wheels[-1]} failed: {done.stderr.strip()[-300:]}"
    # its pure-Python dependencies (numpy, typing-extensions, diskcache, jinja2) come from the index
    _pip("install", "-q", "numpy", "typing-extensions", "diskcache", "jinja2")
    import importlib
    importlib.invalidate_caches()
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama_cpp does not import after installing the wheel: {e}"
    return None


# llama-cpp-python 0.3.36's `[server]` extra (its pyproject.toml): what `python -m llama_cpp.server`
# imports on top of the wheel, as (requirement, import name)
SERVER_DEPS = (("uvicorn>=0.22.0", "uvicorn"), ("fastapi>=0.100.0", "fastapi"),
               ("pydantic-settings>=2.0.1", "pydantic_settings"), ("sse-starlette>=1.6.1", "sse_starlette"),
               ("starlette-context>=0.3.6,<0.4", "starlette_context"), ("PyYAML>=5.1", "yaml"))
# installed versions of these stay as they are: tallow serve runs on them in the same environment
KEEP = ("starlette", "uvicorn", "pydantic", "anyio")


def ensure_llama_cpp_server():
    """None when llama-cpp-python's OpenAI server's own dependencies import (installing the
    missing ones from the index, with the versions in KEEP pinned to what is installed; the
    wheel itself is ensure_llama_cpp's); else the reason they are not available."""
    import importlib.util
    from importlib import metadata

    def missing():
        return [req for req, module in SERVER_DEPS if importlib.util.find_spec(module) is None]

    if not missing():
        return None
    pins = []
    for name in KEEP:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(pins) + "\n")
    try:
        done = _pip("install", "-q", "-c", f.name, *missing())
    finally:
        os.unlink(f.name)
    if done.returncode:
        return f"installing llama-cpp-python's server dependencies failed: {done.stderr.strip()[-300:]}"
    importlib.invalidate_caches()
    left = missing()
    return f"llama-cpp-python's server dependencies {left} do not import after installing them" if left else None
