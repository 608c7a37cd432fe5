"""Starting ranks and ending them cleanly.

`mpirun_command(n, command)` is the command line that starts n ranks of `command` (by default
`python -m luminar.distributed ARGS...`, see `module_command`) on this machine: oversubscribed, so
more ranks than cores work; with the root settings Open MPI insists on when run as root.
`run_ranks(n, command, timeout)` runs it with a deadline.

`as_rank(fn)` is how every rank runs its work: a luminar error on one rank prints one line naming
the rank and aborts the whole job (MPI_Abort), so the other ranks stop at once instead of waiting
in a collective until their deadline; any other exception prints its traceback first.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import traceback

from ..errors import LuminarError, UnsupportedError
from .comm import Communicator, DistributedError

ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def module_command(args: list[str]) -> list[str]:
    """`python -m luminar.distributed args...` with this interpreter."""
    return [sys.executable, "-m", "luminar.distributed", *args]


def mpirun_command(ranks: int, command: list[str]) -> list[str]:
    """The mpirun command line that starts `ranks` processes of `command`."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise UnsupportedError("mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    if not isinstance(ranks, int) or ranks < 1:
        raise UnsupportedError(f"the number of ranks must be an int >= 1, got {ranks!r}")
    # --oversubscribe: this machine may have fewer cores than ranks; binding off so ranks share cores
    return [mpirun, "--oversubscribe", "--bind-to", "none", "-n", str(ranks), *command]


def mpirun_env(threads_per_rank: int | None = None, extra: dict | None = None) -> dict:
    """The environment for mpirun (the ranks inherit it): Open MPI's root settings, the ranks'
    OpenMP threads, and `extra` (e.g. LUMINAR_DIST_TIMEOUT)."""
    env = {**os.environ, **ROOT_ENV, **(extra or {})}
    if threads_per_rank is not None:
        env["OMP_NUM_THREADS"] = str(threads_per_rank)
    return env


def run_ranks(ranks: int, command: list[str], timeout: float, threads_per_rank: int | None = 1,
              env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    """Run `ranks` ranks of `command` to completion, output captured; DistributedError if they are
    still running after `timeout` seconds (mpirun and its ranks are killed)."""
    # its own session, so a timeout can end mpirun and every rank it started (one process group)
    process = subprocess.Popen(mpirun_command(ranks, command), env=mpirun_env(threads_per_rank, env), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(process)
        stdout, stderr = process.communicate()
        raise DistributedError(f"mpirun -n {ranks} {' '.join(command)} did not finish within {timeout:g} s; "
                               f"output so far:\n{stdout}{stderr}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to mpirun's process group (mpirun passes it to the ranks), SIGKILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def as_rank(fn, comm: Communicator | None = None) -> int:
    """Run fn(comm) on this rank; on an error, report it and abort every rank of the job."""
    comm = comm or Communicator.world()
    try:
        return int(fn(comm) or 0)
    except LuminarError as e:
        print(f"luminar.distributed: rank {comm.rank} of {comm.size}: error: {e}", file=sys.stderr, flush=True)
    except BaseException:  # a bug, or KeyboardInterrupt: still end the whole job
        print(f"luminar.distributed: rank {comm.rank} of {comm.size}: unexpected error:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
    comm.abort(1)
    return 1
