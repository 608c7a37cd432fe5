"""Pipeline-parallel training (GPipe): a model's consecutive parts on consecutive ranks.

Each rank builds the graph of its own stage and wraps it in a PipelineStage:

    g = lm.Graph()
    if comm.rank == 0:                                   # first stage: reads the batch
        x = g.tensor("x", ("n", 6)); activation = None
    else:                                                # later stages: read the stage before
        x = activation = g.tensor("h", ("n", 16))
    ...                                                  # this stage's layers, params w1, b1, ...
    output = loss if last else hidden                    # the last stage ends in a mean loss
    stage = PipelineStage(output, params, optimizer, init, comm=comm, activation=activation)
    stage.step(batch, micro_batches=4)                   # each stage passes the inputs it reads

A step splits the batch into micro-batches (equal consecutive rows, as DataParallel does) and
runs GPipe's schedule: stage 0 pushes every micro-batch forward (sending its activations on
without waiting), each later stage runs a micro-batch as soon as it arrives, and gradients flow
back the same way, tagged by micro-batch so nothing can be mismatched. Backward passes
*recompute* their stage's forward from the kept input rather than storing activations (GPipe's
re-materialization): a stage's memory holds its micro-batch inputs only. Each stage accumulates
its parameters' gradients over the micro-batches in order (deterministic), each weighted by its
share of the batch, so the update equals training on the whole batch at once; the update is
luminar.optim.TrainStep's (data_parallel.update_step), so schedules, clipping and save/load work
per stage (a stage's checkpoint holds its own parameters).
"""
from __future__ import annotations

import math

import numpy as np

import luminar as lm

from ..errors import InputError, ShapeError
from ..optim.optimizers import Optimizer, _params_dict
from .comm import Communicator, _split_counts
from .data_parallel import update_step


class PipelineStage:
    """This rank's stage of a pipeline over `comm` (rank i is stage i; see the module docstring).

    output      the last stage: its scalar mean loss; the others: the activation they pass on
    params      {key: input tensor} of this stage's parameters; init their values
    activation  the input tensor holding the previous stage's output (None on the first stage)
    """

    def __init__(self, output, params: dict, optimizer: Optimizer, init: dict, *,
                 comm: Communicator | None = None, activation=None, backend: str = "cpu", **options):
        self.comm = comm or Communicator.world()
        self.is_first, self.is_last = self.comm.rank == 0, self.comm.rank == self.comm.size - 1
        if (activation is None) != self.is_first:
            raise InputError(f"pipeline stage {self.comm.rank}: the first stage (only) has no activation input")
        params = _params_dict(optimizer, params)
        self.param_inputs = {key: p.node.name for key, p in params.items()}
        self.activation_name = activation.node.name if activation is not None else None
        graph = output.graph
        # forward (not the last stage): the activation sent on
        if not self.is_last:
            output.output("pp_out")
            self.forward_program = graph.compile(backend, **options)
            upstream = graph.tensor("pp_upstream", output.shape)
            objective = (output * upstream).sum()  # d objective / d x = the vector-Jacobian product
        else:
            if math.prod(output.shape) != 1:
                raise ShapeError(f"pipeline: the last stage's output must be the scalar loss, got shape {output.shape}")
            objective = output
            output.output("pp_loss")
        wanted = list(params.values()) + ([activation] if activation is not None else [])
        grads = lm.grad(objective, wanted)
        for i, g in enumerate(grads):
            g.output(f"pp_grad{i}")
        # backward: recomputes this stage's forward, then gradients (params, then the activation)
        self.backward_program = graph.compile(backend, **options)
        self.train = update_step(params, optimizer, init, backend=backend, **options)
        self.shapes = [tuple(p.shape) for p in params.values()]
        self.comm.agree(self.comm.size, "the number of pipeline stages")

    def step(self, inputs: dict, micro_batches: int = 1, dims: dict | None = None) -> float:
        """One training step on the batch: each stage passes the inputs its graph reads (the first
        stage the data, the last the targets, ...), all split into `micro_batches` along axis 0.
        Returns the whole batch's loss (on every stage)."""
        chunks, shares = _micro_batches(dict(inputs), micro_batches, self.comm)
        params = self.train.params()
        weights = {self.param_inputs[k]: v for k, v in params.items()}
        prev, succ = self.comm.rank - 1, self.comm.rank + 1
        kept, sends, loss = [], [], 0.0
        for j, chunk in enumerate(chunks):  # forwards, in micro-batch order
            if not self.is_first:
                chunk = {**chunk, self.activation_name: self.comm.recv(prev, tag=j, what="pipeline activation")}
            kept.append(chunk)
            if not self.is_last:
                activation = self.forward_program.run({**chunk, **weights}, dims)["pp_out"]
                sends.append(self.comm.send(activation, succ, tag=j, what="pipeline activation"))
        grads = [np.zeros(s, np.float32) for s in self.shapes]
        for j, chunk in enumerate(kept):  # backwards, in the same order (the last stage starts them)
            feed = {**chunk, **weights}
            if not self.is_last:
                upstream = self.comm.recv(succ, tag=len(chunks) + j, what="pipeline gradient")
                feed["pp_upstream"] = upstream
            out = self.backward_program.run(feed, dims)
            scale = np.float32(shares[j]) if self.is_last else np.float32(1)  # upstream grads are weighted already
            for i in range(len(grads)):
                grads[i] += out[f"pp_grad{i}"] * scale
            if not self.is_first:
                activation_grad = out[f"pp_grad{len(grads)}"] * scale
                sends.append(self.comm.send(activation_grad, prev, tag=len(chunks) + j, what="pipeline gradient"))
            if self.is_last:
                loss += float(out["pp_loss"].reshape(-1)[0]) * shares[j]
        for handle in sends:
            handle.wait()
        loss = float(self.comm.broadcast(np.array([loss], np.float64) if self.is_last else None,
                                         root=self.comm.size - 1, what="pipeline loss")[0])
        return self.train.step({**{f"dp_grad{i}": g for i, g in enumerate(grads)},
                                "dp_loss": np.array([loss], np.float32)})

    def params(self) -> dict[str, np.ndarray]:
        return self.train.params()

    def save(self, path) -> None:
        """This stage's parameters and optimizer state (a TrainStep file; one per stage)."""
        self.train.save(path)

    def load(self, path) -> None:
        self.train.load(path)


def _micro_batches(inputs: dict, count: int, comm: Communicator) -> tuple[list[dict], list[float]]:
    """The inputs cut into `count` consecutive row blocks, and each block's share of the batch.
    Every stage must cut the same number of rows (checked across ranks)."""
    if not isinstance(count, int) or count < 1:
        raise InputError(f"pipeline: micro_batches must be an int >= 1, got {count!r}")
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    sizes = {v.shape[0] if v.ndim else None for v in arrays.values()}
    if len(sizes) > 1 or None in sizes:
        raise ShapeError(f"pipeline: the batch inputs must share a leading batch axis, got "
                         f"{ {k: v.shape for k, v in arrays.items()} }")
    n = sizes.pop() if sizes else None
    rows = [r for r in comm.all_gather_object(n, "the pipeline batch size") if r is not None]
    if len(set(rows)) != 1:
        raise ShapeError(f"pipeline: stages were given batches of different sizes: {rows}")
    n = rows[0]
    if count > n:
        raise ShapeError(f"pipeline: {count} micro-batches of a batch of {n} rows")
    counts = _split_counts(n, count)
    starts = [sum(counts[:j]) for j in range(count)]
    chunks = [{k: v[s:s + c] for k, v in arrays.items()} for s, c in zip(starts, counts)]
    return chunks, [c / n for c in counts]
