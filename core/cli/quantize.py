"""`tallow quantize in.safetensors out.gguf --type q4_k`: a float checkpoint to GGUF
(2-D float weights quantised; tallow.io.quantize says what happens to the rest)."""
from ..io.quantize import quantize_file
from ..quant.quantize_numpy import ENCODERS


def add_arguments(p):
    p.add_argument("src", help="input weights (.safetensors, model.safetensors.index.json, .gguf)")
    p.add_argument("dst", help="output .gguf (written to a temporary file, renamed into place when complete)")
    p.add_argument("--type", default="q4_k", choices=sorted(ENCODERS),
                   help="block format for 2-D weights (default q4_k)")
    p.add_argument("-v", "--verbose", action="store_true", help="print what happens to each tensor")


def run(args):
    kinds = quantize_file(args.src, args.dst, args.type, log=print if args.verbose else None)
    n_q = sum(1 for k in kinds.values() if k == args.type)
    print(f"wrote {args.dst}: {len(kinds)} tensors, {n_q} quantised to {args.type}")
    return 0
