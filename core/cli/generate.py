"""`tallow generate "PROMPT"`: stream a language model's continuation to stdout;
the token count and speed go to stderr."""
import sys

from .args import fraction, non_negative_float, non_negative_int, positive_float, positive_int, probability

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_model_arguments(parser):
    """Options shared by `generate` and `chat`."""
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"a known name (see `tallow fetch --list`), a Hugging Face-layout directory "
                             f"or a .gguf file (default {DEFAULT_MODEL}; fetched on first use)")
    parser.add_argument("--device", default=None, help="cpu (numpy), python, wgpu... (default: the best available)")
    parser.add_argument("--max-tokens", type=positive_int, default=256,
                        help="stop after this many new tokens (default 256)")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0,
                        help="0 is greedy (the default); higher is more random")
    parser.add_argument("--top-k", type=non_negative_int, default=0,
                        help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass (1.0: off)")
    parser.add_argument("--min-p", type=fraction, default=0.0, help="drop tokens below min-p x the top probability")
    parser.add_argument("--repetition-penalty", type=positive_float, default=1.0, help="> 1 discourages repeats")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling (reproducible output)")
    parser.add_argument("--stop", action="append", default=None, help="stop at this text (repeatable)")


def add_arguments(parser):
    parser.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="wrap the prompt as a user message in the chat template "
                           "(the default when the model has one)")
    mode.add_argument("--raw", action="store_true", help="plain text completion, even for a model with a chat template")
    parser.add_argument("--system", default=None, help="a system message (chat mode)")
    add_model_arguments(parser)


def sampling_options(args):
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop)


def load(args):
    from ..models import load_model
    model = load_model(args.model, device=args.device)
    if getattr(model, "tokenizer", None) is None or not hasattr(model, "stream"):
        from ..errors import Error
        raise Error(f"{args.model} is not a language model with a tokenizer")
    return model


def print_stream(stream, out=None):
    out = out or sys.stdout
    for piece in stream:
        out.write(piece)
        out.flush()


def report(stream, err=None):
    err = err or sys.stderr
    n = len(stream.token_ids)
    total = stream.prefill_seconds + stream.decode_seconds
    rate = n / total if total else 0.0
    print(f"{n} tokens, {rate:.1f} tok/s (prefill {stream.prefill_tokens_per_second:.1f} tok/s, "
          f"{stream.prompt_tokens - stream.cached_tokens} new prompt tokens; "
          f"decode {stream.decode_tokens_per_second:.1f} tok/s)", file=err)
    if stream.finish_reason == "context":
        print("stopped: the model's context window is full", file=err)


def run(args):
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = load(args)
    # Instruct models answer a bare question with end-of-turn: use their template unless --raw.
    if args.chat or (not args.raw and getattr(model.tokenizer, "chat_template", None)):
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": prompt}]
        stream = model.chat(messages, stream=True, **sampling_options(args))
    else:
        stream = model.stream(prompt, **sampling_options(args))
    print_stream(stream)
    print()
    report(stream)
    return 0
