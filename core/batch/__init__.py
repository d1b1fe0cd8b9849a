"""`tallow transcribe` over many files: the inputs and their plan (inputs.py), one
worker that loads Whisper once and writes each transcript (worker.py), run on local
processes (local.py) or a Ray cluster (ray.py), with a progress line (progress.py)."""
