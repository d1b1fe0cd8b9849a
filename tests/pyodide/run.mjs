// A long-lived Pyodide process for pytest, speaking JSON lines.
//
// Usage: node run.mjs [path/to/node_modules/pyodide]
// (default: node_modules/pyodide next to this file, or $TALLOW_PYODIDE_DIR).
//
// After boot it prints one line {"ready": true, "boot_s", "pyodide", "python"}.
// Then, for each request line on stdin, exactly one reply line on stdout:
//   {"id", "op": "run", "code"}                    -> {"id", "ok", "result", "stdout", "stderr", "error"}
//   {"id", "op": "install_wheel", "path"}          -> {"id", "ok", "result": site-packages dir, "error"}
//   {"id", "op": "mount", "host", "target"}        -> {"id", "ok", "result": target, "error"}
// Requests run one at a time, in order. Python code runs on this thread and
// cannot be interrupted, so the caller enforces time limits by killing us.
// Anything Pyodide or Python prints outside a request goes to stderr: stdout
// carries the protocol only.
import { readFileSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pyodideDir = resolve(process.argv[2] || process.env.TALLOW_PYODIDE_DIR || join(here, "node_modules", "pyodide"));
const protocolOut = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
console.log = console.error; // Pyodide logs "Loading ..." lines with console.log

if (!existsSync(join(pyodideDir, "pyodide.mjs"))) {
  protocolOut({ ready: false, error: `no Pyodide at ${pyodideDir} (run scripts/pyodide_setup.sh)` });
  process.exit(2);
}

const started = performance.now();
const { loadPyodide } = await import(pathToFileURL(join(pyodideDir, "pyodide.mjs")).href);
const toStderr = { batched: (line) => process.stderr.write(line + "\n") };
const pyodide = await loadPyodide({ indexURL: pyodideDir + "/", stdout: toStderr.batched, stderr: toStderr.batched });
const harness = pyodide.runPython(readFileSync(join(here, "harness.py"), "utf8") + "\nrun_request");
const sitePackages = pyodide.runPython("import site; site.getsitepackages()[0]");
// With JS promise integration (browsers; newer Node) enter Python through
// callPromising so that pyodide.ffi.run_sync works inside a request.
const canStackSwitch = typeof WebAssembly.Suspending === "function";
const runRequest = (id, code) => (canStackSwitch ? harness.callPromising(id, code) : harness(id, code));

protocolOut({
  ready: true,
  boot_s: (performance.now() - started) / 1000,
  pyodide: pyodide.version,
  python: pyodide.runPython("import sys; sys.version"),
  stack_switching: canStackSwitch,
});

async function handle(request) {
  const { id, op } = request;
  if (op === "run") {
    // Python writes the whole reply line: JSON.parse here would reject NaN.
    return await runRequest(id ?? null, String(request.code));
  }
  if (op === "install_wheel") {
    // unpackArchive refuses a Node Buffer: it wants a plain Uint8Array.
    const bytes = new Uint8Array(readFileSync(request.path));
    pyodide.unpackArchive(bytes, "wheel", { extractDir: sitePackages });
    pyodide.runPython("import importlib; importlib.invalidate_caches()");
    return { id, ok: true, result: sitePackages, error: null };
  }
  if (op === "mount") {
    pyodide.FS.mkdirTree(request.target);
    pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: resolve(request.host) }, request.target);
    pyodide.runPython("import importlib; importlib.invalidate_caches()");
    return { id, ok: true, result: request.target, error: null };
  }
  return { id, ok: false, result: null, error: `unknown op ${JSON.stringify(op)}` };
}

let queue = Promise.resolve();
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (!line.trim()) return;
  queue = queue.then(async () => {
    let request = {};
    try {
      request = JSON.parse(line);
      const reply = await handle(request);
      if (typeof reply === "string") process.stdout.write(reply + "\n");
      else protocolOut(reply);
    } catch (err) {
      protocolOut({ id: request.id ?? null, ok: false, result: null, error: `runner: ${err && err.stack ? err.stack : err}` });
    }
  });
});
lines.on("close", () => queue.then(() => process.exit(0)));
