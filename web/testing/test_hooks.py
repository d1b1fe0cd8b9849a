"""Test builds only (`build(..., test_hooks=True)`): lets the browser tests evaluate Python in the
demo's worker. The shipped site leaves this module out, so a page cannot ask its worker to run code."""
import json


async def run_code(code):
    """Evaluate Python source; the JSON text of its last expression (NaN/Infinity kept: the caller parses it)."""
    from pyodide.code import eval_code_async
    return json.dumps(await eval_code_async(code, {"__name__": "__main__"}))


async def copy_model_files(model, folder="/models"):
    """Fetch the files of `model` as the site's manifest lists them (parts joined) into the worker's
    file system under folder/model, so code that opens model paths (benches) runs as it does natively.
    The bytes go from each response straight into the file system: never a Python bytes object."""
    import os

    import js
    import pyodide_js
    manifest = json.loads(await (await js.fetch("models/manifest.json")).text())
    entry = manifest["models"].get(model)
    if entry is None:
        raise ValueError(f"{model!r} is not in this site's models ({', '.join(manifest['models'])})")
    if entry["missing"]:
        raise FileNotFoundError(f"{model}: {entry['missing']}")
    out = f"{folder}/{model}"
    os.makedirs(out, exist_ok=True)
    for f in entry["files"]:
        stream = pyodide_js.FS.open(f"{out}/{f['name']}", "w")
        try:
            for part in f.get("parts") or [f]:
                response = await js.fetch(part["url"])
                if not response.ok:
                    raise OSError(f"{part['url']}: HTTP {response.status}")
                data = js.Uint8Array.new(await response.arrayBuffer())
                pyodide_js.FS.write(stream, data, 0, data.length)
        finally:
            pyodide_js.FS.close(stream)
        if os.path.getsize(f"{out}/{f['name']}") != f["size"]:
            raise OSError(f"{f['name']}: {os.path.getsize(out + '/' + f['name'])} bytes, the manifest says {f['size']}")
    return out
