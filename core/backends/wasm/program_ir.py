"""The module's `run(program, count)` export as IR: `count` calls read from the i32 words at
`program` (program.py's format), each dispatched by its opcode to the kernel it names. A switch
over program.OPS; an unknown opcode traps."""
from llvmlite import ir

from .kernels_ir import _I32, _I64, _P32, _function, _intrinsic, _Loop, _slot
from .program import OPS


def add_run(module):
    b, (words, count) = _function(module, "run", [(_P32, _I32), (_I32, _I64)])
    pc = _slot(b, ir.Constant(_I64, 0))
    with _Loop(b, count):
        at = b.load(pc)
        op = b.load(b.gep(words, [at]))
        after = b.append_basic_block("call_done")
        bad = b.append_basic_block("bad_opcode")
        switch = b.switch(op, bad)
        for code, (name, kinds) in enumerate(OPS):
            fn = module.globals[name]
            fn.attributes.add("noinline")  # a call, not a second copy of every kernel inside run
            if len(fn.args) != len(kinds):
                raise AssertionError(f"program.OPS: {name} takes {len(kinds)} arguments; the kernel {len(fn.args)}")
            case = b.append_basic_block(f"call_{name}")
            switch.add_case(ir.Constant(_I32, code), case)
            b.position_at_end(case)
            args = []
            for i, (kind, param) in enumerate(zip(kinds, fn.args)):
                word = b.load(b.gep(words, [b.add(at, ir.Constant(_I64, i + 1))]))
                if (kind == "f") != isinstance(param.type, ir.FloatType):
                    raise AssertionError(f"program.OPS' kinds for {name} do not match its parameters")
                args.append(b.bitcast(word, param.type) if kind == "f" else word)
            b.call(fn, args)
            b.store(b.add(at, ir.Constant(_I64, len(kinds) + 1)), pc)
            b.branch(after)
        b.position_at_end(bad)
        _intrinsic(b, "llvm.trap", ir.VoidType(), [])
        b.unreachable()
        b.position_at_end(after)
    b.ret_void()
