"""Make llama-cpp-python importable for the benches that compare against llama.cpp.

It has no wheel for most platforms on PyPI, so the first run builds one from the
sdist (about 15 minutes on 2 cores; needs cmake and a C++ compiler) into
$TALLOW_HOME/wheels, and every later run installs that cached wheel in seconds.
"""
import glob
import os
import subprocess
import sys

VERSION = "0.3.36"  # the version measured in the README
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
              "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF")


def wheel_dir():
    home = os.environ.get("TALLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tallow")
    return os.path.join(home, "wheels")


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
        env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
        done = _pip("wheel", f"llama-cpp-python=={VERSION}", "--no-deps", "--no-binary", "llama-cpp-python",
                    "-w", folder, env=env)
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
