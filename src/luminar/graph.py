"""The primitive graph: nodes, inputs, outputs, and the entry points that compile and run it.

A Graph is a DAG built in topological order. Every node is one of the twelve primitives
(ops.py) or a data node:

- ``input``      a named buffer with a shape (ints and symbolic dims) and a storage dtype
- ``constant``   a float, or a symbolic integer expression over the index variables and dims
                 (an arange is the constant ``_d0``); its shape says where it is defined
- ``contiguous`` materializes the view of its source into a fresh row-major buffer

A node's sources are edges ``(node, ShapeTracker)``: the view is on the edge, so permute,
slice, expand, pad ... never create nodes. Each node's own result is a contiguous buffer of
``node.shape``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import dtypes
from .errors import DTypeError, InputError, ShapeError, ValueDomainError, UnsupportedError
from .ops import PRIMITIVES, Primitive
from .shape import ShapeTracker
from .symbolic import Expr, Var, sym

DATA_OPS = ("input", "constant", "contiguous")


@dataclass(eq=False)
class Node:
    op: str  # a primitive name or one of DATA_OPS
    srcs: tuple  # ((Node, ShapeTracker), ...)
    shape: tuple  # of Expr: the shape of this node's (contiguous) result
    axis: int | None = None  # reductions: the reduced axis of the source view
    name: str | None = None  # inputs
    dtype: str = dtypes.float32  # inputs: storage dtype; everything computed is float32
    value: float | Expr | None = None  # constants
    id: int = field(default=-1)

    @property
    def primitive(self) -> Primitive | None:
        return PRIMITIVES.get(self.op)

    def __repr__(self):
        extra = self.name or (self.value if self.op == "constant" else self.axis)
        return f"%{self.id} = {self.op}({', '.join(f'%{s.id}' for s, _ in self.srcs)}{'' if extra is None else f'; {extra}'})"


def parse_dim(d) -> Expr:
    """An int >= 0, a dim name ('s') or an Expr, as an Expr. Names starting with '_' are reserved.

    A named dim is a variable with lower bound 1: symbolic sizes are never 0, which lets the
    simplifier prove facts like min(1, s) = 1 (slices of symbolic dims stay readable).
    """
    if isinstance(d, str):
        if not d.isidentifier() or d.startswith("_"):
            raise ShapeError(f"invalid dimension name {d!r}: use an identifier not starting with '_'")
        return Var(d, 1, None)
    if isinstance(d, (bool, float)) or not isinstance(d, (int, np.integer, Expr)):
        raise ShapeError(f"invalid dimension {d!r}: expected an int, a name or a symbolic expression")
    e = sym(int(d)) if isinstance(d, (int, np.integer)) else d
    if e.is_const and e.value < 0:
        raise ShapeError(f"invalid dimension {d}: sizes must be >= 0")
    return e


def as_shape(shape) -> tuple:
    """A shape given as one dim (an int, a dim name or an Expr) or as a sequence of dims, as a tuple."""
    return (shape,) if isinstance(shape, (int, np.integer, str, Expr)) else tuple(shape)


def show_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class Graph:
    """A static graph of primitive ops. Build it through GraphTensors, then `compile` it."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.inputs: dict[str, Node] = {}
        self.outputs: dict[str, tuple[Node, ShapeTracker]] = {}
        self.updates: dict[str, str] = {}  # input name -> the output holding its next value

    # -- building -----------------------------------------------------------------------------
    def add(self, node: Node) -> Node:
        node.id = len(self.nodes)
        self.nodes.append(node)
        return node

    def tensor(self, name: str, shape, dtype="float32"):
        """Declare a named input of `shape` (ints and dim names such as 's') and storage `dtype`."""
        from .tensor import GraphTensor
        if not isinstance(name, str) or not name.isidentifier():
            raise InputError(f"input name must be an identifier, got {name!r}")
        if name in self.inputs:
            raise InputError(f"input {name!r} is already declared in this graph")
        dims = tuple(parse_dim(d) for d in as_shape(shape))
        node = self.add(Node("input", (), dims, name=name, dtype=dtypes.normalize(dtype)))
        self.inputs[name] = node
        return GraphTensor(self, node, ShapeTracker.contiguous(dims))

    def constant(self, value, shape=()):
        """A float constant broadcast to `shape`, or an integer expression over index vars `_dk`."""
        from .tensor import GraphTensor
        if isinstance(value, Expr):
            node_shape, val = tuple(parse_dim(d) for d in shape), value
        else:
            try:
                val = float(value)
            except (TypeError, ValueError):
                raise ValueDomainError(f"constant must be a number or a symbolic expression, got {value!r}") from None
            if not math.isfinite(val):
                raise ValueDomainError(f"constant {value!r} is not finite; use a finite bound such as -1e30")
            node_shape = ()
        node = self.add(Node("constant", (), node_shape, value=val))
        t = GraphTensor(self, node, ShapeTracker.contiguous(node_shape))
        if shape and not node_shape:
            t = t.reshape(*([1] * len(shape))).expand(*shape)
        return t

    def update(self, target, value) -> None:
        """State that persists across calls: after each run, input `target` holds `value`.

        Parameters, optimizer moments and running statistics are inputs a training step rewrites.
        The compiled program keeps the new array as that input's value for the next call (as if
        given to `set_inputs`; the array is handed over, not copied) and `Program.state` reads it.
        """
        node = getattr(target, "node", None)
        if node is None or node.op != "input" or target.graph is not self:
            raise InputError(f"update target must be an input of this graph, got {target!r}")
        if getattr(value, "graph", None) is not self:
            raise InputError(f"update of input {node.name!r}: the new value must be a tensor of the same graph")
        if tuple(value.dims) != node.shape:
            raise ShapeError(f"update of input {node.name!r}: value shape {show_shape(value.dims)} "
                             f"!= input shape {show_shape(node.shape)}")
        if node.dtype != "float32":
            raise DTypeError(f"update of input {node.name!r}: state must be float32, the input is {node.dtype}")
        if node.name in self.updates:
            raise InputError(f"input {node.name!r} already has an update in this graph")
        self.updates[node.name] = f"{node.name}__next"
        value.output(self.updates[node.name])

    # -- compiling -----------------------------------------------------------------------------
    def compile(self, backend: str = "reference", **options):
        """Compile the graph's outputs for `backend` ("reference", "cpu", "opencl" or "cuda"); returns a
        callable Program.

        Options: `passes` (which generic passes run, see compiler.passes.optimize); for "cuda" also
        `allow_tf32` (default False: matmuls stay exact float32); for "cpu" (and the GPU backends):
        `search` False (the default, unless the environment variable LUMINAR_SEARCH is 1 or a
        number of seconds), True or a time budget in seconds: pick each kernel's schedule by
        search (compiler/search.py), results cached on disk; `search_dims` {dim: int or [ints]},
        the values symbolic dims take while candidates are timed (default 128 each; several
        values: a schedule per shape bucket); `seed` (default 0) for the candidates sampled;
        `target` a CPUTarget variant. `program.explain()` tells what the search chose and why.
        """
        import inspect
        from .backends import get_backend
        if not self.outputs:
            raise ShapeError("the graph has no outputs: mark tensors with .output(name) before compiling")
        from .compiler.passes import optimize
        program = get_backend(backend)
        accepted = inspect.signature(program.__init__).parameters
        unknown = sorted(set(options) - {"passes"} - set(accepted))
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            raise UnsupportedError(f"{backend} backend: unknown options {unknown}; known: "
                                   f"{sorted(set(accepted) - {'self', 'graph'}) + ['passes']}")
        return program(optimize(self, **{k: options.pop(k) for k in ("passes",) if k in options}), **options)

    def dims(self) -> set[str]:
        """Names of the symbolic dimensions used anywhere in the graph."""
        in_shapes = {name for n in self.nodes for d in n.shape for name in d.vars()}
        values = [n.value for n in self.nodes if isinstance(n.value, Expr)]  # (skipping their index vars _dk)
        return in_shapes | {name for e in values for name in e.vars() if not name.startswith("_")}

    def to_dot(self) -> str:
        """The graph in Graphviz DOT: one box per node, edges labelled with non-trivial views."""
        lines = ["digraph luminar {", "  rankdir=TB; node [shape=box, fontname=monospace];"]
        out_of = {id(node): name for name, (node, _) in self.outputs.items()}
        for n in self.nodes:
            label = {"input": f"{n.name}: input {n.dtype}", "constant": f"constant {n.value}"}.get(n.op, n.op)
            if n.axis is not None:
                label += f" axis={n.axis}"
            label += f"\n{show_shape(n.shape)}"
            style = ", style=filled, fillcolor=lightblue" if n.op == "input" else ""
            lines.append(f'  n{n.id} [label="{_dot_escape(label)}"{style}];')
            for src, st in n.srcs:
                view = "" if st.is_contiguous() and st.shape == src.shape else f' [label="{_dot_escape(show_shape(st.shape))}"]'
                lines.append(f"  n{src.id} -> n{n.id}{view};")
            if id(n) in out_of:
                lines.append(f'  out_{out_of[id(n)]} [label="{out_of[id(n)]}", shape=oval]; n{n.id} -> out_{out_of[id(n)]};')
        return "\n".join(lines + ["}"])

    def display(self):
        """The graph as a graphviz.Source (renders inline in notebooks); needs the `graphviz` package."""
        try:
            import graphviz
        except ImportError:
            raise UnsupportedError("display() needs the graphviz package (pip install 'luminar[viz]'); "
                                   "to_dot() returns the DOT text without it") from None
        return graphviz.Source(self.to_dot())


def _dot_escape(s: str) -> str:
    """A DOT string literal's contents: backslashes and quotes escaped, newlines as \\n."""
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
