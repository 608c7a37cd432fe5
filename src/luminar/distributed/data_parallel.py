"""Data-parallel training: every rank holds all parameters and trains on its shard of the batch.

    comm = Communicator.world()
    train = DataParallel(loss, {"w": w}, AdamW(lr=1e-2), init={"w": w0}, comm=comm)
    for xb, yb in batches:                 # the full batch on every rank (or sharded=True: its own)
        train.step({"x": xb, "y": yb})     # -> the loss over the whole batch
    train.save("run.safetensors")          # written once, by rank 0, atomically

How a step runs. The user's graph (loss, parameters as inputs, batch inputs with a symbolic batch
dim) is compiled as a *gradient program*: loss and gradients, no update. A second, tiny graph
holds the update: its inputs are the parameters (same names), the gradients and the loss, and it
is an ordinary luminar.optim.TrainStep, so schedules, gradient clipping (of the global gradient:
clipping happens after the all-reduce), state_dict/save/load and the optimizer state are
TrainStep's own. Between the two programs the gradients are all-reduced:

- each rank's gradients are weighted by its share of the batch (n_rank / n) and summed over ranks,
  which is the gradient of the full batch's mean loss (the loss must be a mean over the batch);
- gradients are packed into buckets of about `bucket_bytes` and all buckets are in flight
  together (Communicator.all_reduce_many); the loss rides in the last bucket. The backward is one
  compiled call, so communication cannot overlap it; it overlaps between buckets only.
- the sums are formed in rank order and are bit-identical on every rank (comm.py), so the
  parameters stay identical on every rank without ever being broadcast; `check_replicas()`
  verifies it (a hash of the parameters, compared across ranks).

Checkpoints are TrainStep files: the state is replicated, so a file saved on N ranks loads on M
ranks, or into a plain single-process TrainStep. `load` reads the file on rank 0 and broadcasts it
(no shared file system needed).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from ..errors import InputError, LuminarError, ShapeError, WeightFileError
from ..graph import Graph
from ..autograd import grad as autograd
from ..optim.train import TrainStep
from ..optim.optimizers import Optimizer, _grads_list, _params_dict
from .comm import Communicator, DistributedError, _split_counts

DEFAULT_BUCKET_BYTES = 4 << 20


class DataParallel:
    """TrainStep across the ranks of `comm`; see the module docstring.

    loss, params, optimizer, init, grads, schedule, max_grad_norm, backend, compile_options: as for
    TrainStep (buffers are not supported: their updates would differ per rank).
    comm          the Communicator (default: every rank mpirun started)
    replicated    names of step inputs that are not split by batch (every rank gets all of them)
    bucket_bytes  gradient bytes per all-reduce message
    """

    def __init__(self, loss, params: dict, optimizer: Optimizer, init: dict, *, comm: Communicator | None = None,
                 grads=None, schedule=None, max_grad_norm: float | None = None, replicated=(),
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, backend: str = "cpu", **compile_options):
        self.comm = comm or Communicator.world()
        self.replicated = set(replicated)
        if not isinstance(bucket_bytes, int) or bucket_bytes < 4:
            raise InputError(f"DataParallel: bucket_bytes must be an int >= 4, got {bucket_bytes!r}")
        params = _params_dict(optimizer, params)
        grads = _grads_list(optimizer, params, autograd(loss, list(params.values())) if grads is None else grads)
        # the gradient program: loss and gradients of this rank's shard
        self.keys = list(params)
        self.shapes = [tuple(p.shape) for p in params.values()]
        loss.output("dp_loss")
        for i, g in enumerate(grads):
            g.output(f"dp_grad{i}")
        self.gradient_program = loss.graph.compile(backend, **compile_options)
        self.train = update_step(params, optimizer, init, schedule=schedule, max_grad_norm=max_grad_norm,
                                 backend=backend, **compile_options)
        self.param_inputs = {key: p.node.name for key, p in params.items()}
        self.buckets = _buckets([math.prod(s) for s in self.shapes], bucket_bytes // 4)
        self.comm.agree((self.keys, self.shapes, repr(optimizer)), "the parameters and optimizer of DataParallel")

    # -- one step ---------------------------------------------------------------------------------
    def step(self, inputs: dict, dims: dict | None = None, sharded: bool = False) -> float:
        """One step on the batch `inputs` (name -> array, batch along axis 0): the full batch on every
        rank (this rank takes its consecutive share), or with sharded=True this rank's own rows.
        Returns the loss of the whole batch."""
        local, share = self._shard(dict(inputs), sharded)
        params = self.train.params()
        feed = {**local, **{self.param_inputs[k]: params[k] for k in self.keys}}
        out = self.gradient_program.run(feed, dims)
        # weight by this rank's share, pack into buckets (the loss last), sum over ranks
        grads = [out[f"dp_grad{i}"].reshape(-1) * np.float32(share) for i in range(len(self.keys))]
        loss = np.asarray(out["dp_loss"], np.float32).reshape(-1)[:1] * np.float32(share)
        packed = [np.concatenate([grads[i] for i in bucket]) for bucket in self.buckets]
        packed[-1] = np.concatenate([packed[-1], loss])
        summed = self.comm.all_reduce_many(packed, "gradient all-reduce")
        total = {"dp_loss": summed[-1][-1:]}
        for bucket, flat in zip(self.buckets, summed):
            offset = 0
            for i in bucket:
                size = math.prod(self.shapes[i])
                total[f"dp_grad{i}"] = flat[offset:offset + size].reshape(self.shapes[i])
                offset += size
        return self.train.step(total)

    def _shard(self, inputs: dict, sharded: bool) -> tuple[dict, float]:
        """This rank's rows of the batch inputs, and its share of the batch (n_rank / n)."""
        batch = {k: np.asarray(v) for k, v in inputs.items() if k not in self.replicated}
        sizes = {k: (v.shape[0] if v.ndim else None) for k, v in batch.items()}
        if not batch or None in sizes.values() or len(set(sizes.values())) != 1:
            raise ShapeError(f"DataParallel.step: the batch inputs must share a leading batch axis, got shapes "
                             f"{ {k: v.shape for k, v in batch.items()} } (name non-batch inputs in replicated=)")
        n = next(iter(sizes.values()))
        signature = (sorted(inputs), None if sharded else {k: v.shape for k, v in batch.items()})
        everyone = self.comm.all_gather_object((n, signature), "the batch of DataParallel.step")
        if any(s != signature for _, s in everyone):
            raise DistributedError(f"DataParallel.step: ranks were given different batches: "
                                   + "; ".join(f"rank {r}: {s}" for r, (_, s) in enumerate(everyone)))
        if sharded:
            total = sum(m for m, _ in everyone)
            return inputs, n / total
        counts = _split_counts(n, self.comm.size)
        if counts[self.comm.rank] == 0:
            raise ShapeError(f"DataParallel.step: a batch of {n} rows leaves rank {self.comm.rank} of "
                             f"{self.comm.size} without rows")
        start = sum(counts[:self.comm.rank])
        rows = slice(start, start + counts[self.comm.rank])
        return {k: (v[rows] if k in batch else v) for k, v in inputs.items()}, counts[self.comm.rank] / n

    # -- state ------------------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        return self.train.step_count

    def params(self) -> dict[str, np.ndarray]:
        return self.train.params()

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.train.state_dict()

    def check_replicas(self) -> None:
        """DistributedError unless every rank holds bit-identical parameters and optimizer state."""
        digest = hashlib.sha256()
        for key, array in sorted(self.train.state_dict().items()):
            digest.update(key.encode()), digest.update(np.ascontiguousarray(array).tobytes())
        self.comm.agree(digest.hexdigest(), "the training state (a hash of parameters and optimizer state)")

    def save(self, path) -> None:
        """Rank 0 writes the checkpoint (atomically, TrainStep.save); every rank returns once it is
        written, or raises the error rank 0 met."""
        error = None
        if self.comm.rank == 0:
            try:
                self.train.save(path)
            except (LuminarError, OSError) as e:
                error = f"{type(e).__name__}: {e}"
        error = self.comm.broadcast_object(error, 0, "saving a checkpoint")
        if error is not None:
            raise WeightFileError(f"rank 0 could not save {path}: {error}")

    def load(self, path) -> None:
        """Read a TrainStep checkpoint (saved on any number of ranks) on rank 0 and load it everywhere."""
        tensors = error = None
        if self.comm.rank == 0:
            from safetensors import SafetensorError
            from safetensors.numpy import load_file
            try:
                tensors = load_file(str(path))
            except (SafetensorError, OSError, ValueError) as e:
                error = f"{path}: not a readable safetensors file ({e})"
        tensors, error = self.comm.broadcast_object((tensors, error), 0, "loading a checkpoint")
        if error is not None:
            raise WeightFileError(error)
        self.train.load_state_dict(tensors, source=str(path))


def update_step(params: dict, optimizer: Optimizer, init: dict, **options) -> TrainStep:
    """A TrainStep that only updates: its graph's inputs are the parameters (the names of `params`,
    inputs of another graph), their gradients "dp_grad0", "dp_grad1", ... and the loss "dp_loss"
    (passed through as the step's result). TrainStep owns schedules, clipping and checkpoints."""
    update = Graph()
    update_params = {key: update.tensor(p.node.name, p.shape) for key, p in params.items()}
    update_grads = [update.tensor(f"dp_grad{i}", p.shape) for i, p in enumerate(params.values())]
    return TrainStep(update.tensor("dp_loss", (1,)) + 0.0, update_params, optimizer, init, grads=update_grads,
                     **options)


def _buckets(sizes: list[int], per_bucket: int) -> list[list[int]]:
    """Consecutive groups of gradient indices holding about `per_bucket` elements each."""
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        if current and filled + size > per_bucket:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    buckets.append(current)
    return buckets
