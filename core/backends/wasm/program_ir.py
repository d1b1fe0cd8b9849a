"""The module's `run(program, count, step)` export as IR: `count` calls read from the i32 words at
`program` (program.py's format), each dispatched by its opcode to the kernel it names, its
StepArgs read from the step words at `step`. A switch over program.OPS; an unknown opcode traps."""
from llvmlite import ir

from .kernels_ir import _I32, _I64, _P32, _function, _intrinsic, _Loop, _slot
from .program import OPS


def add_run(module):
    b, (words, count, step) = _function(module, "run", [(_P32, _I32), (_I32, _I64), (_P32, _I32)])
    pc = _slot(b, ir.Constant(_I64, 0))
    one, three = ir.Constant(_I64, 1), ir.Constant(_I64, 3)
    with _Loop(b, count):
        at = b.load(pc)
        op = b.load(b.gep(words, [at]))
        mask = b.load(b.gep(words, [b.add(at, one)]))
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
            p = b.add(at, ir.Constant(_I64, 2))
            args = []
            for i, (kind, param) in enumerate(zip(kinds, fn.args)):
                if (kind == "f") != isinstance(param.type, ir.FloatType):
                    raise AssertionError(f"program.OPS' kinds for {name} do not match its parameters")
                word = b.load(b.gep(words, [p]))
                if kind == "f":
                    args.append(b.bitcast(word, param.type))
                    p = b.add(p, one)
                    continue
                # a StepArg (mask bit i): base + stride * step[slot], three words; else the word itself
                moves = b.icmp_unsigned("!=", b.and_(mask, ir.Constant(_I32, 1 << i)), ir.Constant(_I32, 0))
                stride = b.load(b.gep(words, [b.add(p, one)]))
                slot = b.select(moves, b.load(b.gep(words, [b.add(p, ir.Constant(_I64, 2))])), ir.Constant(_I32, 0))
                moved = b.add(word, b.mul(stride, b.load(b.gep(step, [slot]))))
                args.append(b.select(moves, moved, word))
                p = b.add(p, b.select(moves, three, one))
            b.call(fn, args)
            b.store(p, pc)
            b.branch(after)
        b.position_at_end(bad)
        _intrinsic(b, "llvm.trap", ir.VoidType(), [])
        b.unreachable()
        b.position_at_end(after)
    b.ret_void()
