"""`luminar parallel`: start the ranks of a distributed generation under mpirun.

    luminar parallel --ranks 2 --mode tensor --model DIR --prompt "Once upon a time"
    luminar parallel --ranks 2 --mode pipeline --model DIR --ids 3,17,99 --max-new-tokens 8

It runs `mpirun --oversubscribe -n RANKS python -m luminar.distributed generate ...` (see
__main__.py) with the machine's cores shared among the ranks' threads, and returns its exit
status; output streams through. Registered in cli.COMMAND_MODULES.
"""
from __future__ import annotations

import os
import subprocess


def add_commands(commands) -> None:
    from .__main__ import add_generate_options
    parser = commands.add_parser("parallel", help="generate with a model split over several processes (MPI)",
                                 description="Greedy generation with the model split over RANKS MPI processes.")
    parser.add_argument("--ranks", type=int, default=2, metavar="N", help="number of processes (default 2)")
    add_generate_options(parser)
    parser.set_defaults(handler=run)


def run(args, log) -> int:
    from ..errors import InputError
    from .launch import module_command, mpirun_command, mpirun_env
    if args.ranks < 1:
        raise InputError(f"--ranks must be >= 1, got {args.ranks}")
    forwarded = ["generate", "--model", args.model, "--mode", args.mode, "--max-new-tokens", str(args.max_new_tokens),
                 "--backend", args.backend]
    forwarded += ["--prompt", args.prompt] if args.prompt is not None else ["--ids", args.ids]
    forwarded += ["--chat"] if args.chat else []
    forwarded += ["--quiet"] if args.quiet else []
    command = mpirun_command(args.ranks, module_command(forwarded))
    threads = max(1, (os.cpu_count() or 1) // args.ranks)
    log(f"starting {args.ranks} ranks ({threads} thread{'s' if threads > 1 else ''} each): {' '.join(command)}")
    return subprocess.run(command, env=mpirun_env(threads)).returncode
