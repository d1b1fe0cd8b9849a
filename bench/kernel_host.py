"""Host time and launches per decoded token on the CUDA/Metal kernel backend, with a driver that
does nothing (tallow/backends/kernel/null_driver.py): what is timed is tallow's own Python.

    python bench/kernel_host.py [--tokens N] [--repeats R]

The backend is the Metal one (its dense matmul is a kernel, so every op is a launch) over the
do-nothing driver; CUDA's host path is the same code. Measured for SmolLM2-135M-Instruct (Q4_1)
one-token decode and Whisper tiny.en's decoder, eager and captured (tallow.capture: a replay is
one driver call, as a CUDA graph launch is). Each figure is the best of R runs: the box is shared.
Models come from $TALLOW_HOME (`tallow fetch smollm2-135m-instruct whisper-tiny.en`).
"""
import argparse
import os
import time

import tallow
from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.kernel.null_driver import NullKernelDriver
from tallow.device import restore_backend, use_backend
from tallow_metal.backend import MetalBackend


class NullMetalBackend(MetalBackend):
    def __init__(self):
        KernelBackend.__init__(self, NullKernelDriver("metal"))


def _per_token(driver, step, tokens, repeats):
    """(launches, best host ms) per call of step()."""
    best = float("inf")
    for _ in range(repeats):
        driver.launches = 0
        t0 = time.perf_counter()
        for _ in range(tokens):
            step()
        best = min(best, (time.perf_counter() - t0) / tokens * 1000)
    return driver.launches / tokens, best  # the last run's launches


def smollm2(dev, driver, home, tokens, repeats):
    folder = os.path.join(home, "smollm2-135m-instruct")
    model = tallow.load_model(os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf"), device=dev)
    for capture in (False, True):
        model.capture_decode = capture
        cache = model.new_cache()
        model([1, 2, 3], cache=cache, last_only=True).tolist()
        for _ in range(3):  # two captured steps confirm the recording; later ones replay
            model([4], cache=cache, last_only=True).tolist()
        yield capture, _per_token(driver, lambda: model([4], cache=cache, last_only=True).tolist(), tokens, repeats)


def whisper_tiny(dev, driver, home, tokens, repeats):
    from tallow.models import whisper
    model = whisper.load(os.path.join(home, "whisper-tiny.en"), device=dev)
    feats = model.encode(tallow.zeros(1, model.config.num_mel_bins, 3000, device=dev))
    for capture in (False, True):
        model.capture_decode = capture
        state = model.start(feats)
        model.decode_step([[50257, 50362, 1]], state).tolist()
        for _ in range(3):
            model.decode_step([[4]], state).tolist()
        yield capture, _per_token(driver, lambda: model.decode_step([[4]], state).tolist(), tokens, repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    home = os.environ.get("TALLOW_HOME") or os.path.expanduser("~/.cache/tallow")
    backend = NullMetalBackend()
    dev = use_backend("metal", backend)
    try:
        for name, run in (("smollm2-135m q4_1", smollm2), ("whisper tiny.en decoder", whisper_tiny)):
            for capture, (launches, ms) in run(dev, backend.driver, home, args.tokens, args.repeats):
                print(f"{name:24} {'captured' if capture else 'eager':8} {launches:5.0f} launches/token "
                      f"{ms:6.2f} host ms/token")
    finally:
        restore_backend("metal")


if __name__ == "__main__":
    main()
