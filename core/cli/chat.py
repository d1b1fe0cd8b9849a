"""`tallow chat`: an interactive conversation. Each line on stdin is a user
message; the reply streams back. The history is kept (and its KV cache reused,
so each turn only prefills the new text). /reset forgets it, /exit quits.

When the conversation outgrows the model's context window the turn is refused
with a message (the session goes on: /reset, or a shorter message); with
--drop-oldest-turns the oldest turns are dropped instead (the system message
stays), and a note on stderr says how many."""
import sys

from .generate import add_model_arguments, load, report, sampling_options
from ..errors import ContextWindowError


def add_arguments(parser):
    parser.add_argument("--system", default=None, help="a system message that starts the conversation")
    parser.add_argument("--stats", action="store_true", help="print tokens and tok/s after each reply (stderr)")
    parser.add_argument("--drop-oldest-turns", action="store_true",
                        help="when the conversation no longer fits the model's context window, drop its oldest turns "
                             "(keeping the system message) instead of refusing the message")
    add_model_arguments(parser)


def run(args, stdin=None, stdout=None):
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    model = load(args)
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    interactive = stdin.isatty()
    if interactive:
        print("tallow chat: type a message; /reset forgets the conversation, /exit quits.", file=sys.stderr)
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            history = list(start)
            model.reset()
            continue
        history.append({"role": "user", "content": text})
        policy = "drop_oldest" if args.drop_oldest_turns else "error"
        try:
            stream = model.chat(history, stream=True, history_policy=policy, **sampling_options(args))
        except ContextWindowError as e:
            history.pop()
            print(f"tallow chat: {e}", file=sys.stderr)
            continue
        if len(stream.messages) < len(history):
            print(f"(dropped the {len(history) - len(stream.messages)} oldest messages to fit the "
                  f"{model.context_window}-token context window)", file=sys.stderr)
            history = stream.messages
        reply = []
        for piece in stream:
            reply.append(piece)
            stdout.write(piece)
            stdout.flush()
        stdout.write("\n")
        stdout.flush()
        history.append({"role": "assistant", "content": "".join(reply)})
        if args.stats:
            report(stream)
    return 0
