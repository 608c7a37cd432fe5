"""Collectives as graph operations: a graph split into compiled segments at each collective.

luminar's core graph has twelve compute primitives and no communication, and it stays that way:
a collective here is a *boundary* in the graph. A CollectiveGraph is a sequence of ordinary
luminar Graphs (segments); calling a collective on a tensor of the current segment ends that
segment (the tensor becomes one of its outputs) and starts the next one, in which the
collective's result is an input. Compiling compiles each segment for the backend; running runs
them in order and executes the collective through the Communicator between them.

    cg = CollectiveGraph(comm)
    x = cg.tensor("x", ("s", 64))
    w = cg.tensor("w", (64, 32))                  # this rank's column shard of a weight
    partial = x @ w @ cg.tensor("v", (32, 64))    # row-parallel: a partial sum on each rank
    y, x = cg.all_reduce(partial, carry=[x])      # y: the sum over ranks; x carried across the cut
    (x + y).output("out")
    program = cg.compile("cpu")
    program.set_inputs(w=..., v=...)
    program.run({"x": ...})["out"]

Why segments rather than a communication primitive: each segment is a normal graph, so the whole
compiler (fusion, search, memory planning) applies unchanged inside it, and the primitive set is
untouched. The cost is that the compiler cannot fuse across a collective, which is also where
real systems synchronize. Tensors a later segment needs are passed across a cut explicitly
(`carry`), so what crosses each boundary is visible.

Collectives: all_reduce (sum, rank order: deterministic and identical on every rank),
all_gather and reduce_scatter along an axis, broadcast from a root, and send / recv between two
ranks. Inputs keep their names across segments: declaring the same name in two segments (a
RoPE table, a cache) means the same input, fed to both. Symbolic dims are shared too: `run`'s
`dims` bind every segment.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, ShapeError
from ..graph import Graph, parse_dim
from ..shape import ShapeTracker
from ..tensor import GraphTensor
from .comm import Communicator


@dataclass
class _Step:
    """The communication between segment i and i+1."""
    kind: str  # all_reduce, all_gather, reduce_scatter, broadcast, send, recv
    source: str | None  # the output of segment i it reads (None for recv)
    target: str | None  # the input of segment i+1 it writes (None for send)
    carried: list = field(default_factory=list)  # names passed through unchanged
    axis: int = 0
    peer: int = 0  # root (broadcast), destination (send) or source (recv)
    tag: int = 0


class CollectiveGraph:
    """Segments of luminar graphs joined by collectives over `comm` (see the module docstring)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.segments: list[Graph] = [Graph()]
        self.steps: list[_Step] = []
        self._declared: dict[str, tuple] = {}  # input name -> (shape, dtype), shared by all segments

    @property
    def graph(self) -> Graph:
        """The current segment (build on it with its tensors' methods)."""
        return self.segments[-1]

    def tensor(self, name: str, shape, dtype: str = "float32") -> GraphTensor:
        """An input of the current segment; the same name in several segments is one input."""
        if name.startswith("dist__"):
            raise InputError(f"input name {name!r}: names starting with 'dist__' are reserved")
        key = (tuple(str(parse_dim(d)) for d in (shape if isinstance(shape, (tuple, list)) else (shape,))), dtype)
        if self._declared.setdefault(name, key) != key:
            raise ShapeError(f"input {name!r} is declared as {key} here but as {self._declared[name]} "
                             f"in an earlier segment")
        if name in self.graph.inputs:
            node = self.graph.inputs[name]
            return GraphTensor(self.graph, node, ShapeTracker.contiguous(node.shape))
        return self.graph.tensor(name, shape, dtype)

    # -- collectives: each ends the current segment ------------------------------------------
    def all_reduce(self, tensor: GraphTensor, carry=()):
        """The sum of `tensor` over all ranks (rank order). Returns it, followed by the carried
        tensors when `carry` is given."""
        return self._cut("all_reduce", tensor, tensor.dims, carry)

    def all_gather(self, tensor: GraphTensor, axis: int = 0, carry=()):
        """Every rank's `tensor` concatenated along `axis` in rank order (equal shapes)."""
        axis = _axis(axis, tensor)
        dims = list(tensor.dims)
        dims[axis] = dims[axis] * self.comm.size
        return self._cut("all_gather", tensor, dims, carry, axis=axis)

    def reduce_scatter(self, tensor: GraphTensor, axis: int = 0, carry=()):
        """Block `rank` along `axis` of the sum over ranks (the axis must divide by the world size)."""
        axis = _axis(axis, tensor)
        dims = list(tensor.dims)
        if not dims[axis].is_const or dims[axis].value % self.comm.size:
            raise ShapeError(f"reduce_scatter: axis {axis} of shape {tensor.shape} must be a fixed size "
                             f"divisible by {self.comm.size} ranks")
        dims[axis] = parse_dim(dims[axis].value // self.comm.size)
        return self._cut("reduce_scatter", tensor, dims, carry, axis=axis)

    def broadcast(self, tensor: GraphTensor, root: int = 0, carry=()):
        """Rank `root`'s `tensor` on every rank (all ranks build the same shape)."""
        return self._cut("broadcast", tensor, tensor.dims, carry, peer=self._rank(root))

    def send(self, tensor: GraphTensor, dest: int, tag: int = 0, carry=()):
        """Send `tensor` to rank `dest` (which calls recv). Returns the carried tensors (a tuple)."""
        out = self._cut("send", tensor, None, carry, peer=self._rank(dest), tag=tag)
        return out if isinstance(out, tuple) else ()

    def recv(self, shape, source: int, tag: int = 0, carry=()):
        """The tensor rank `source` sends (shape as for `tensor`, symbolic dims allowed)."""
        return self._cut("recv", None, [parse_dim(d) for d in shape], carry, peer=self._rank(source), tag=tag)

    def _cut(self, kind, tensor, result_dims, carry, axis=0, peer=0, tag=0):
        index = len(self.steps)
        carry = list(carry)
        for t in ([tensor] if tensor is not None else []) + carry:
            if not isinstance(t, GraphTensor) or t.graph is not self.graph:
                raise InputError(f"{kind}: {t!r} is not a tensor of the current segment (carry tensors of an "
                                 f"earlier segment across the cut with carry=[...])")
        source = target = None
        if tensor is not None:
            source = f"dist__{index}_out"
            tensor.output(source)
        carried = []
        for j, t in enumerate(carry):
            name = f"dist__{index}_carry{j}"
            t.output(name)
            carried.append((name, t.dims))
        self.segments.append(Graph())
        new = self.segments[-1]
        results = []
        if result_dims is not None:
            target = f"dist__{index}_in"
            results.append(new.tensor(target, tuple(result_dims)))
        results += [new.tensor(name, tuple(dims)) for name, dims in carried]
        self.steps.append(_Step(kind, source, target, [n for n, _ in carried], axis, peer, tag))
        return results[0] if len(results) == 1 else tuple(results)

    def _rank(self, rank):
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.comm.size:
            raise InputError(f"rank {rank!r} is not in 0..{self.comm.size - 1}")
        return int(rank)

    def compile(self, backend: str = "cpu", **options) -> "CollectiveProgram":
        """Compile every segment that computes something (see Graph.compile for the options)."""
        return CollectiveProgram(self, backend, **options)


class CollectiveProgram:
    """Compiled segments and the collectives between them; `run` executes the whole thing."""

    def __init__(self, graph: CollectiveGraph, backend: str, **options):
        self.comm, self.steps = graph.comm, graph.steps
        # a segment without outputs (e.g. one that only receives) has nothing to compile
        self.programs = [g.compile(backend, **options) if g.outputs else None for g in graph.segments]
        for g, program in zip(graph.segments, self.programs):
            if program is None and g.inputs:
                raise InputError(f"inputs {sorted(g.inputs)} are declared in a segment that computes nothing")
        self.inputs = {name for g in graph.segments for name in g.inputs if not name.startswith("dist__")}

    def set_inputs(self, inputs: dict | None = None, /, **named) -> "CollectiveProgram":
        """Inputs that stay the same across calls (weights), given to every segment that reads them."""
        inputs = {**(inputs or {}), **named}
        unknown = sorted(set(inputs) - self.inputs)
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the inputs are {sorted(self.inputs)}")
        for program in self.programs:
            if program is not None:
                mine = {k: v for k, v in inputs.items() if k in program.graph.inputs}
                if mine:
                    program.set_inputs(mine)
        return self

    def resident_bytes(self) -> int:
        """Bytes of the inputs set once (the weights this rank holds), over all segments; an array
        given to several segments counts once."""
        seen = {}
        for program in self.programs:
            if program is not None:
                for array in program.fixed.values():
                    seen[id(array)] = array.nbytes
        return sum(seen.values())

    def run(self, inputs: dict | None = None, dims: dict | None = None) -> dict[str, np.ndarray]:
        """Run all segments and collectives; returns every user output of every segment."""
        inputs = dict(inputs or {})
        unknown = sorted(set(inputs) - self.inputs)
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the inputs are {sorted(self.inputs)}")
        values = dict(inputs)  # what later segments may read: user inputs and cut results
        results, pending = {}, []
        for i, program in enumerate(self.programs):
            if program is not None:
                feed = {name: values[name] for name in program.graph.inputs if name in values}
                out = program.run(feed, dims)
                values.update((k, v) for k, v in out.items() if k.startswith("dist__"))
                results.update((k, v) for k, v in out.items() if not k.startswith("dist__"))
            if i < len(self.steps):
                pending += self._communicate(self.steps[i], values)
        for handle in pending:  # sends complete before the next run may reuse their arrays
            handle.wait()
        return results

    def _communicate(self, step: _Step, values: dict) -> list:
        comm, what = self.comm, f"{step.kind} #{self.steps.index(step)}"
        # carried tensors keep their names on both sides of the cut: nothing to do for them
        source = values.pop(step.source) if step.source else None
        if step.kind == "all_reduce":
            values[step.target] = comm.all_reduce(source, what)
        elif step.kind == "all_gather":
            values[step.target] = comm.all_gather(source, step.axis, what)
        elif step.kind == "reduce_scatter":
            values[step.target] = comm.reduce_scatter(source, step.axis, what)
        elif step.kind == "broadcast":
            values[step.target] = comm.broadcast(source if comm.rank == step.peer else None, step.peer, what)
        elif step.kind == "send":
            return [comm.send(source, step.peer, step.tag, what)]
        elif step.kind == "recv":
            values[step.target] = comm.recv(step.peer, step.tag, what)
        return []


def _axis(axis: int, tensor: GraphTensor) -> int:
    if not -tensor.ndim <= axis < tensor.ndim:
        raise ShapeError(f"axis {axis} is out of range for shape {tensor.shape}")
    return axis % tensor.ndim
