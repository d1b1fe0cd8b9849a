"""What a captured step (tallow.capture; the one recording class is
core/backends/step_recording.py) holds on a kernel backend (CUDA, Metal, their emulators).

Entries are ("launch", module, kernel, grid, block, args) -- what driver.launch takes -- or
("call", fn, signature): a host-side op that writes into buffers the step owns (the dense
matmul of the CUDA backend, cuBLAS, and of the emulators, numpy), run again by calling fn.
The kernels that depend on the position (rope_kv_write and kv_write's cache slots and rotary
rows, attention_step's key count over the KV cache the step wrote) read the step buffer.
A driver's replay of the entries: the emulators launch them again (relaunch below), CuPy
launches the CUDA graph it built from them, Metal encodes them into one command buffer.
"""


def _arg_signature(a):
    if isinstance(a, (int, float, tuple)):  # host.I32 ... F64 scalars and Meta arrays: their values
        return (type(a).__name__, a)
    return ("buffer", a.dtype.name, a.numel)  # a DeviceStorage: buffers made in the step differ, sizes must not


def entry_signature(entry):
    """What must match for two entries to be the same at two positions: kernel, grid, block,
    scalar and meta arguments and buffer sizes; for a host call, its signature."""
    if entry[0] == "launch":
        _, module, kernel, grid, block, args = entry
        return (module, kernel, grid, block, tuple(_arg_signature(a) for a in args))
    return ("call", entry[2])


def relaunch(driver, entries):
    """Run recorded entries again in order through the driver protocol (the emulators' replay)."""
    for e in entries:
        if e[0] == "launch":
            driver.launch(*e[1:])
        else:
            e[1]()
