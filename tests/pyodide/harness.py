"""Runs inside Pyodide: executes one request's source and answers with a JSON string.

run.mjs loads this file once after boot and calls `run_request(id, code)` for each
request. Each request gets a fresh global namespace (imported modules stay in
sys.modules, so `import tallow` is paid once). The value of the last expression
is the result; it must be JSON-serialisable so that pytest sees plain lists.
"""
import contextlib
import io
import json
import linecache
import traceback

from pyodide.code import eval_code_async


async def run_request(request_id, code):
    """The reply line (JSON text, NaN/Infinity allowed as Python's json module writes them)."""
    filename = f"<request {request_id}>"
    # Registered so that tracebacks show the failing source lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    out, err = io.StringIO(), io.StringIO()
    reply = {"id": request_id, "ok": True, "result": None, "error": None}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            reply["result"] = await eval_code_async(code, {"__name__": "__main__"}, filename=filename)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the caller must hear of them
        reply = {"id": request_id, "ok": False, "result": None, "error": _format(exc, filename)}
    reply["stdout"], reply["stderr"] = out.getvalue(), err.getvalue()
    try:
        return json.dumps(reply)
    except (TypeError, ValueError) as exc:
        reply["ok"], reply["result"] = False, None
        reply["error"] = f"the result is not JSON-serialisable: {exc}"
        return json.dumps(reply)


def _format(exc, filename):
    # Drop the harness's and eval_code_async's own frames: start at the request's code.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
