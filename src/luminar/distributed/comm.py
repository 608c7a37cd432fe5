"""Communicator: MPI collectives over numpy arrays, with deadlines and a fixed reduction order.

Everything luminar.distributed sends between processes goes through this class, which wraps an
mpi4py communicator (Open MPI underneath). Two properties matter more here than raw speed:

- **Determinism.** MPI's own Allreduce may add contributions in an order that depends on the
  algorithm Open MPI picks for a message size, so a sum need not be bit-identical to the same
  sum on another number of ranks, or even on every rank. Here a sum is always formed in rank
  order 0, 1, ..., N-1 by the rank that owns a slice of the array (an all-to-all delivers each
  rank its slice of every contribution), then the sums are all-gathered: every rank ends with
  the very same bits, and the result depends only on the contributions.
- **No hangs.** Every operation is non-blocking underneath and is polled until a deadline
  (`timeout` seconds, default LUMINAR_DIST_TIMEOUT or 60). A peer that died, hangs, or runs a
  different program makes the others raise DistributedError naming the operation and the
  rank, instead of waiting forever; `abort()` (what the launcher calls on any error) then ends
  the whole job.

Arrays are float32 (what compiled programs produce); send/recv and broadcast keep any dtype.
Byte and time counters (`stats`) feed bench/dist.py.
"""
from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, LuminarError, ShapeError

DEFAULT_TIMEOUT = float(os.environ.get("LUMINAR_DIST_TIMEOUT", "60"))


class DistributedError(LuminarError, RuntimeError):
    """A collective that could not complete: a peer died, hangs, or disagrees about the program."""


@dataclass
class CommStats:
    """What this rank sent and how long it waited, per kind of operation (for benchmarks)."""
    calls: dict = field(default_factory=dict)
    bytes_sent: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def add(self, kind: str, nbytes: int, seconds: float) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes_sent[kind] = self.bytes_sent.get(kind, 0) + int(nbytes)
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds

    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> None:
        self.calls.clear(), self.bytes_sent.clear(), self.seconds.clear()


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:  # mpi4py missing, or built against an MPI library that is gone
        raise DistributedError(f"luminar.distributed needs mpi4py and an MPI library (Debian: openmpi-bin, "
                               f"libopenmpi-dev; pip: mpi4py): {e}") from None
    return MPI


class Communicator:
    """A group of ranks that run collectives together; `Communicator.world()` is every process
    mpirun started. `rank` is this process's index, `size` the number of ranks."""

    def __init__(self, mpi_comm, timeout: float | None = None):
        self._comm = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self.stats = CommStats()
        self._tags = 0  # point-to-point messages of one logical operation share a tag

    @classmethod
    def world(cls, timeout: float | None = None) -> "Communicator":
        return cls(_mpi().COMM_WORLD, timeout)

    def split(self, color: int, key: int | None = None) -> "Communicator":
        """Sub-communicators: ranks passing the same color form one (ordered by key, default rank)."""
        return Communicator(self._comm.Split(color, self.rank if key is None else key), self.timeout)

    def __repr__(self):
        return f"Communicator(rank {self.rank} of {self.size})"

    # -- waiting with a deadline ------------------------------------------------------------------
    def _wait(self, requests: list, what: str) -> None:
        """Poll `requests` until all complete, or raise DistributedError after self.timeout."""
        MPI = _mpi()
        deadline = time.monotonic() + self.timeout
        pause = 0.0
        while not MPI.Request.Testall(requests):
            if time.monotonic() > deadline:
                raise DistributedError(f"rank {self.rank} of {self.size}: {what} did not complete within "
                                       f"{self.timeout:g} s (a peer died, hangs, or runs a different program)")
            time.sleep(pause)  # spin briefly, then back off so a waiting rank leaves the CPU to the others
            pause = min(1e-3, pause + 2e-5)

    def _timed(self, kind: str, nbytes: int, started: float) -> None:
        self.stats.add(kind, nbytes, time.perf_counter() - started)

    # -- collectives ------------------------------------------------------------------------------
    def all_reduce(self, array: np.ndarray, what: str = "all_reduce") -> np.ndarray:
        """The elementwise sum over ranks, added in rank order, identical on every rank."""
        return self.all_reduce_many([array], what)[0]

    def all_reduce_many(self, arrays: list, what: str = "all_reduce") -> list[np.ndarray]:
        """all_reduce of several arrays at once: all their messages are in flight together, and each
        array's second phase starts as soon as its own first phase is done (bucketed gradients)."""
        started = time.perf_counter()
        arrays = [_float32(a, what) for a in arrays]
        phase1 = [self._scatter_slices(a) for a in arrays]
        results = []
        for a, (request, parts, counts) in zip(arrays, phase1):
            self._wait([request], f"{what} (exchange)")
            owned = parts[0].copy()  # the sum of this rank's slice, in rank order
            for r in range(1, self.size):
                owned += parts[r]
            out = np.empty(a.size, np.float32)
            request = self._comm.Iallgatherv(owned, [out, counts, _offsets(counts), _mpi().FLOAT])
            results.append((request, out, a.shape))
        self._wait([r for r, _, _ in results], f"{what} (gather)")
        self._timed("all_reduce", sum(2 * a.nbytes * (self.size - 1) // max(self.size, 1) for a in arrays), started)
        return [out.reshape(shape) for _, out, shape in results]

    def _scatter_slices(self, a: np.ndarray):
        """Start the all-to-all that hands rank r slice r of every rank's `a`: (request, parts, counts)
        where parts[q] will hold rank q's copy of this rank's slice."""
        counts = _split_counts(a.size, self.size)
        flat = a.reshape(-1)
        mine = counts[self.rank]
        received = np.empty((self.size, mine), np.float32)
        request = self._comm.Ialltoallv([flat, counts, _offsets(counts), _mpi().FLOAT],
                                        [received, [mine] * self.size, [mine * q for q in range(self.size)],
                                         _mpi().FLOAT])
        return request, received, counts

    def reduce_scatter(self, array: np.ndarray, axis: int = 0, what: str = "reduce_scatter") -> np.ndarray:
        """The sum over ranks (rank order), of which this rank keeps block `rank` along `axis`
        (the axis must divide evenly by the number of ranks)."""
        started = time.perf_counter()
        a = np.moveaxis(_float32(array, what), axis, 0)
        if a.shape[0] % self.size:
            raise ShapeError(f"{what}: axis {axis} has size {a.shape[0]}, not divisible by {self.size} ranks")
        block = a.shape[0] // self.size
        a = np.ascontiguousarray(a)
        received = np.empty((self.size, block, *a.shape[1:]), np.float32)
        self._wait([self._comm.Ialltoall(a, received)], what)
        total = received[0].copy()
        for r in range(1, self.size):
            total += received[r]
        self._timed("reduce_scatter", a.nbytes * (self.size - 1) // self.size, started)
        return np.ascontiguousarray(np.moveaxis(total, 0, axis))

    def all_gather(self, array: np.ndarray, axis: int = 0, what: str = "all_gather") -> np.ndarray:
        """Every rank's array concatenated along `axis` in rank order (shapes may differ along axis only)."""
        started = time.perf_counter()
        a = np.ascontiguousarray(np.moveaxis(np.asarray(array), axis, 0))
        shapes = self.all_gather_object((a.shape, a.dtype.str), what=f"{what} (shapes)")
        if any(s[1:] != a.shape[1:] or d != a.dtype.str for s, d in shapes):
            raise ShapeError(f"{what}: ranks disagree about the shape or dtype off axis {axis}: "
                             f"{[(s, d) for s, d in shapes]}")
        rows = [s[0] for s, _ in shapes]
        out = np.empty((sum(rows), *a.shape[1:]), a.dtype)
        per_row = int(np.prod(a.shape[1:], dtype=np.int64))
        counts = [n * per_row * a.itemsize for n in rows]
        BYTE = _mpi().BYTE
        self._wait([self._comm.Iallgatherv([a, a.nbytes, BYTE], [out, counts, _offsets(counts), BYTE])], what)
        self._timed("all_gather", a.nbytes, started)
        return np.ascontiguousarray(np.moveaxis(out, 0, axis))

    def broadcast(self, array: np.ndarray | None, root: int = 0, what: str = "broadcast") -> np.ndarray:
        """Rank `root`'s array on every rank (the others pass anything, e.g. None)."""
        self._check_rank(root, what)
        header = self.broadcast_object(None if self.rank != root else (np.shape(array), np.asarray(array).dtype.str),
                                       root, what)
        started = time.perf_counter()
        shape, dtype = header
        out = np.ascontiguousarray(array, dtype) if self.rank == root else np.empty(shape, dtype)
        self._wait([self._comm.Ibcast([out, out.nbytes, _mpi().BYTE], root)], what)
        self._timed("broadcast", out.nbytes if self.rank == root else 0, started)
        return out

    def broadcast_object(self, obj, root: int = 0, what: str = "broadcast"):
        """Rank `root`'s picklable object on every rank."""
        self._check_rank(root, what)
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == root else b""
        size = np.array([len(payload)], np.int64)
        self._wait([self._comm.Ibcast(size, root)], f"{what} (size)")
        buffer = np.frombuffer(payload, np.uint8).copy() if self.rank == root else np.empty(int(size[0]), np.uint8)
        self._wait([self._comm.Ibcast(buffer, root)], what)
        return obj if self.rank == root else pickle.loads(buffer.tobytes())

    def all_gather_object(self, obj, what: str = "all_gather") -> list:
        """Every rank's picklable object, in rank order."""
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = np.empty(self.size, np.int64)
        self._wait([self._comm.Iallgather(np.array([payload.size], np.int64), sizes)], f"{what} (sizes)")
        out = np.empty(int(sizes.sum()), np.uint8)
        counts = [int(n) for n in sizes]
        self._wait([self._comm.Iallgatherv(payload, [out, counts, _offsets(counts), _mpi().BYTE])], what)
        return [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(_offsets(counts), counts)]

    def barrier(self, what: str = "barrier") -> None:
        self._wait([self._comm.Ibarrier()], what)

    def agree(self, value, what: str) -> None:
        """Check that every rank holds the same `value` (a world size, a graph's signature, a batch
        shape); else raise DistributedError on every rank, naming the ranks that differ."""
        values = self.all_gather_object(value, what=f"agreeing on {what}")
        if any(v != values[0] for v in values):
            differ = [r for r, v in enumerate(values) if v != values[0]]
            raise DistributedError(f"ranks disagree about {what}: rank 0 has {values[0]!r}, "
                                   + ", ".join(f"rank {r} has {values[r]!r}" for r in differ))

    # -- point to point ---------------------------------------------------------------------------
    def send(self, array: np.ndarray, dest: int, tag: int = 0, what: str = "send"):
        """Start sending `array` to rank `dest`; returns a handle whose wait() finishes the send
        (the array must not change until then). The receiver learns shape and dtype from the message."""
        self._check_rank(dest, what)
        started = time.perf_counter()
        a = np.ascontiguousarray(array)
        header = np.frombuffer(pickle.dumps((a.shape, a.dtype.str)), np.uint8).copy()
        requests = [self._comm.Isend(header, dest, 2 * tag), self._comm.Isend([a, a.nbytes, _mpi().BYTE], dest, 2 * tag + 1)]
        self._timed("send", a.nbytes, started)
        return _Pending(self, requests, (header, a), f"{what} to rank {dest}")

    def recv(self, source: int, tag: int = 0, what: str = "recv") -> np.ndarray:
        """The next array rank `source` sends with `tag` (waits until the deadline)."""
        self._check_rank(source, what)
        MPI = _mpi()
        started = time.perf_counter()
        status = MPI.Status()
        deadline = time.monotonic() + self.timeout
        while not self._comm.Iprobe(source, 2 * tag, status):
            if time.monotonic() > deadline:
                raise DistributedError(f"rank {self.rank} of {self.size}: {what} from rank {source} got nothing "
                                       f"within {self.timeout:g} s (the sender died, hangs, or never sends)")
            time.sleep(2e-4)
        header = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        self._wait([self._comm.Irecv(header, source, 2 * tag)], f"{what} from rank {source}")
        shape, dtype = pickle.loads(header.tobytes())
        out = np.empty(shape, dtype)
        self._wait([self._comm.Irecv([out, out.nbytes, MPI.BYTE], source, 2 * tag + 1)], f"{what} from rank {source}")
        self._timed("recv", 0, started)
        return out

    # -- ending ---------------------------------------------------------------------------------
    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (after an error on this one)."""
        self._comm.Abort(code)

    def _check_rank(self, rank, what):
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise InputError(f"{what}: rank {rank!r} is not in 0..{self.size - 1}")


class _Pending:
    """An unfinished send: wait() completes it (with the communicator's deadline)."""

    def __init__(self, comm: Communicator, requests: list, keep, what: str):
        self.comm, self.requests, self._keep, self.what = comm, requests, keep, what

    def wait(self) -> None:
        if self.requests:
            self.comm._wait(self.requests, self.what)
            self.requests, self._keep = [], None


def _float32(array, what: str) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype != np.float32:
        if a.dtype.kind != "f":
            raise InputError(f"{what}: expected a float array, got {a.dtype}")
        a = a.astype(np.float32)
    return np.ascontiguousarray(a)


def _split_counts(n: int, parts: int) -> list[int]:
    """n elements in `parts` nearly equal consecutive slices (the first ones one larger)."""
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


def _offsets(counts: list[int]) -> list[int]:
    return [sum(counts[:r]) for r in range(len(counts))]
