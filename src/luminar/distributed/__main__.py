"""What each rank runs: `mpirun -n N python -m luminar.distributed generate --model DIR ...`.

    mpirun --oversubscribe -n 2 python -m luminar.distributed generate --model DIR --mode tensor \\
        --prompt "Once upon a time" --max-new-tokens 32
    mpirun -n 2 python -m luminar.distributed generate --model DIR --mode pipeline --ids 3,17,99

Every rank loads its part of the model (tensor: 1/N of every weight; pipeline: its layers) and
takes part in every step; rank 0 prints the continuation (text when the directory has a
tokenizer.json, else the token ids) and, on stderr, the timings. `luminar parallel` (commands.py)
starts this under mpirun for you. An error on any rank prints one line naming the rank and ends
the whole job (launch.as_rank).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m luminar.distributed",
                                     description="Run on every rank of an mpirun job.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    generate = commands.add_parser("generate", help="greedy continuation of a prompt with a model split over the ranks")
    add_generate_options(generate)
    return parser


def add_generate_options(parser: argparse.ArgumentParser) -> None:
    """The options of `generate`, shared with `luminar parallel`."""
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="a Hugging Face Llama-family model directory (safetensors) or a GGUF file")
    parser.add_argument("--mode", choices=["tensor", "pipeline"], default="tensor",
                        help="tensor: every weight split over the ranks; pipeline: layers split into stages")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="text to continue (needs the directory's tokenizer.json)")
    what.add_argument("--ids", help="token ids to continue, comma-separated")
    parser.add_argument("--chat", action="store_true", help="wrap --prompt in the tokenizer's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "reference"])
    parser.add_argument("--quiet", action="store_true", help="no timings on stderr")


def generate(args, comm) -> int:
    from .pipeline import PipelineLlama
    from .tensor_parallel import TensorParallelLlama
    tokenizer = None
    if args.prompt is not None:
        from ..io.tokenizer import Tokenizer
        if os.path.isfile(args.model):  # a GGUF file carries its tokenizer
            from ..io.gguf import read_gguf
            tokenizer = Tokenizer.from_gguf(read_gguf(args.model))
        elif os.path.isfile(os.path.join(args.model, "tokenizer.json")):
            tokenizer = Tokenizer.from_file(args.model)
        else:
            raise InputError(f"--prompt needs {args.model}/tokenizer.json; pass token ids with --ids instead")
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
        ids = tokenizer.encode(text)
    else:
        try:
            ids = [int(part) for part in args.ids.split(",")]
        except ValueError:
            raise InputError(f"--ids must be comma-separated integers, got {args.ids!r}") from None
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    started = time.perf_counter()
    kind = TensorParallelLlama if args.mode == "tensor" else PipelineLlama
    model = kind(args.model, comm, backend=args.backend)
    loaded = time.perf_counter()
    new = model.generate_greedy(ids, args.max_new_tokens, stop_ids=getattr(tokenizer, "stop_ids", ()) or ())
    done = time.perf_counter()
    if comm.rank == 0:
        print(tokenizer.decode(new) if tokenizer is not None else " ".join(map(str, new)), flush=True)
    if comm.rank == 0 and not args.quiet:
        print(f"luminar.distributed: {args.mode} parallel over {comm.size} ranks: loaded and compiled in "
              f"{loaded - started:.1f} s; {len(new)} tokens in {done - loaded:.2f} s; rank 0 holds "
              f"{model.resident_weight_bytes / 2**20:.1f} MiB of weights", file=sys.stderr, flush=True)
    return 0


def main(argv=None) -> int:
    from .launch import as_rank
    args = build_parser().parse_args(argv)
    return as_rank(lambda comm: generate(args, comm))


if __name__ == "__main__":
    sys.exit(main())
