"""`tallow serve`: an OpenAI-compatible HTTP server (Starlette + uvicorn, the `serve` extra).

    tallow serve --model smollm2-135m-instruct --model whisper-tiny.en --device cpu

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/audio/transcriptions,
/v1/audio/translations; GET /v1/models, /health. Every refusal is OpenAI's error JSON
({"error": {"message", "type", "param", "code"}}) with its status code.

How a request runs: the event loop parses and checks it (app.py, params.py), tokenizes
in a thread, then hands a Job to the model's Worker (workers.py): one thread per model
that takes jobs from a bounded queue and runs them one at a time; tokens come back
through the job's asyncio queue (SSE when streaming). A client that leaves, or a request
past its time limit, sets the job's cancel flag, which the generation loop checks between
tokens (and transcription between 30 s windows). Batched decoding would replace the
Worker's one-job loop with a scheduler that steps several jobs together; nothing else
changes.

The modules only use tallow's public API (load_model, tallow.generation, the errors):
this is an application on top of the library, like the CLI.
"""
