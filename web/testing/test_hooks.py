"""Test builds only (`build(..., test_hooks=True)`): lets the browser tests evaluate Python in the
demo's worker. The shipped site leaves this module out, so a page cannot ask its worker to run code."""
import json


async def run_code(code):
    """Evaluate Python source; the JSON text of its last expression (NaN/Infinity kept: the caller parses it)."""
    from pyodide.code import eval_code_async
    return json.dumps(await eval_code_async(code, {"__name__": "__main__"}))
