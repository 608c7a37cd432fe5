"""A primitive graph as plain JSON data, and back: the graph part of an exported artifact.

The format (version 1) is a JSON object

    {"exprs":   [expr, ...],                   # symbolic integers, each naming earlier ones by index
     "nodes":   [node, ...],                   # in topological order; a node names earlier nodes by index
     "inputs":  {"name": node index, ...},
     "outputs": {"name": [node index, view], ...},
     "updates": {"input name": "output name", ...}}

    expr  = ["const", int] | ["var", name, lo or null, hi or null] | ["sum", [[expr, coeff], ...], const]
          | ["mul", [expr, ...]] | ["floordiv", a, b] | ["mod", a, b] | ["min", a, b] | ["max", a, b]
          | ["cmp", "<" | "<=" | "==" | "!=", a, b] | ["and", a, b] | ["or", a, b]
    view  = [[shape exprs], [stride exprs], offset expr, valid expr]     # a ShapeTracker
    node  = {"op": primitive or "input" | "constant" | "contiguous", "srcs": [[node, view], ...],
             "shape": [exprs], "axis": int or null, "name": str or null, "dtype": storage dtype,
             "value": float | {"expr": expr} | null}

Expressions are shared (one entry per distinct expression), so a graph of thousands of nodes
stays small. Reading rebuilds every expression with the symbolic package's own constructors and
checks every reference, op, arity and dtype: a malformed or hostile file is a WeightFileError,
never an exception from deep inside the compiler. A view's history (which view ops made it,
used by autograd only) is not stored: an exported graph is for inference.
"""
from __future__ import annotations

import math

from .. import dtypes
from ..errors import LuminarError, WeightFileError
from ..graph import DATA_OPS, Graph, Node
from ..ops import PRIMITIVES
from ..shape import ShapeTracker
from ..symbolic import And, Compare, Const, Expr, FloorDiv, Max, Min, Mod, Mul, Or, Sum, Var, smax, smin, sym

GRAPH_FORMAT = 1
_ARITY = {"input": 0, "constant": 0, "contiguous": 1, **{name: p.arity for name, p in PRIMITIVES.items()}}
_COMPARISONS = {"<": Expr.lt, "<=": Expr.le, "==": Expr.eq, "!=": Expr.ne}


def graph_to_json(graph: Graph) -> dict:
    """The graph as JSON-serializable data (see the module docstring)."""
    table = _ExprTable()
    index = {id(node): i for i, node in enumerate(graph.nodes)}

    def view(tracker: ShapeTracker) -> list:
        return [[table.add(d) for d in tracker.shape], [table.add(s) for s in tracker.strides],
                table.add(tracker.offset), table.add(tracker.valid)]

    nodes = []
    for node in graph.nodes:
        value = node.value
        if isinstance(value, Expr):
            value = {"expr": table.add(value)}
        nodes.append({"op": node.op, "srcs": [[index[id(src)], view(st)] for src, st in node.srcs],
                      "shape": [table.add(d) for d in node.shape], "axis": node.axis, "name": node.name,
                      "dtype": node.dtype, "value": value})
    return {"format": GRAPH_FORMAT, "exprs": table.entries, "nodes": nodes,
            "inputs": {name: index[id(node)] for name, node in graph.inputs.items()},
            "outputs": {name: [index[id(node)], view(st)] for name, (node, st) in graph.outputs.items()},
            "updates": dict(graph.updates)}


def graph_from_json(data, where: str = "graph") -> Graph:
    """Rebuild a Graph from graph_to_json's data; WeightFileError naming `where` if it is malformed."""
    try:
        return _GraphReader(data, where).graph()
    except LuminarError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError, OverflowError) as e:
        raise WeightFileError(f"{where}: malformed graph ({type(e).__name__}: {e})") from None


class _ExprTable:
    """Distinct expressions in first-seen order, children before parents."""

    def __init__(self):
        self.entries: list = []
        self.index: dict = {}

    def add(self, e: Expr) -> int:
        e = sym(e)
        found = self.index.get(e)
        if found is not None:
            return found
        entry = self._entry(e)
        self.index[e] = len(self.entries)
        self.entries.append(entry)
        return self.index[e]

    def _entry(self, e: Expr) -> list:
        if isinstance(e, Const):
            return ["const", e.value]
        if isinstance(e, Var):
            return ["var", e.name, e.lo, e.hi]
        if isinstance(e, Sum):
            return ["sum", [[self.add(term), coeff] for term, coeff in e.terms], e.const]
        if isinstance(e, Mul):
            return ["mul", [self.add(f) for f in e.children]]
        if isinstance(e, Compare):
            return ["cmp", e.op, self.add(e.a), self.add(e.b)]
        for kind, name in ((FloorDiv, "floordiv"), (Mod, "mod"), (Max, "max"), (Min, "min"), (Or, "or"),
                           (And, "and")):  # subclasses first: Max is a Min, Or an And
            if isinstance(e, kind):
                return [name, self.add(e.a), self.add(e.b)]
        raise WeightFileError(f"graph export: expression {e} of type {type(e).__name__} has no serialization")


class _GraphReader:
    def __init__(self, data, where: str):
        if not isinstance(data, dict):
            raise WeightFileError(f"{where}: a graph must be a JSON object")
        if data.get("format") != GRAPH_FORMAT:
            raise WeightFileError(f"{where}: graph format {data.get('format')!r} is not the {GRAPH_FORMAT} this "
                                  f"luminar reads")
        self.data, self.where = data, where
        self.exprs: list[Expr] = []

    def fail(self, message: str):
        raise WeightFileError(f"{self.where}: {message}")

    def graph(self) -> Graph:
        for i, entry in enumerate(self.data["exprs"]):
            self.exprs.append(self._expr(entry, i))
        g = Graph()
        for i, item in enumerate(self.data["nodes"]):
            g.add(self._node(item, g.nodes, i))
        for name, i in self.data["inputs"].items():
            node = self._ref(g.nodes, i, "input")
            if node.op != "input" or node.name != name:
                self.fail(f"input {name!r} names node {i}, which is not that input")
            g.inputs[name] = node
        if len(g.inputs) != sum(node.op == "input" for node in g.nodes):
            self.fail("an input node is missing from the inputs table")
        for name, (i, view) in self.data["outputs"].items():
            if not isinstance(name, str) or not name.isidentifier():
                self.fail(f"output name {name!r} is not an identifier")
            g.outputs[name] = (self._ref(g.nodes, i, "output"), self._view(view))
        for target, output in self.data["updates"].items():
            if target not in g.inputs or output not in g.outputs:
                self.fail(f"update {target!r} -> {output!r} names an unknown input or output")
            g.updates[target] = output
        if not g.outputs:
            self.fail("the graph has no outputs")
        return g

    def _arg(self, i) -> Expr:
        if type(i) is not int or not 0 <= i < len(self.exprs):
            self.fail(f"expression reference {i!r} is not an earlier expression")
        return self.exprs[i]

    def _expr(self, entry, i: int) -> Expr:
        kind, *args = entry
        if kind == "const" and type(args[0]) is int:
            return sym(args[0])
        if kind == "var":
            name, lo, hi = args
            if not isinstance(name, str) or not all(b is None or type(b) is int for b in (lo, hi)):
                self.fail(f"expression {i}: a variable needs a name and int or null bounds")
            return Var(name, lo, hi)
        if kind == "sum":
            terms, const = args
            if type(const) is not int or not all(type(c) is int for _, c in terms):
                self.fail(f"expression {i}: a sum's coefficients must be ints")
            return sum((self._arg(t) * c for t, c in terms), sym(const))
        if kind == "mul":
            return math.prod((self._arg(f) for f in args[0]), start=sym(1))
        if kind == "cmp" and args[0] in _COMPARISONS:
            return _COMPARISONS[args[0]](self._arg(args[1]), self._arg(args[2]))
        binary = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "min": smin, "max": smax,
                  "and": lambda a, b: a & b, "or": lambda a, b: a | b}
        if kind in binary and len(args) == 2:
            a, b = self._arg(args[0]), self._arg(args[1])
            if kind in ("floordiv", "mod") and b.is_const and b.value <= 0:
                self.fail(f"expression {i}: division by {b.value}")
            return binary[kind](a, b)
        self.fail(f"expression {i}: unknown form {kind!r}")

    def _view(self, view) -> ShapeTracker:
        shape, strides, offset, valid = view
        if len(shape) != len(strides):
            self.fail("a view has as many strides as dims")
        return ShapeTracker(tuple(map(self._arg, shape)), tuple(map(self._arg, strides)), self._arg(offset),
                            self._arg(valid))

    def _ref(self, nodes: list, i, what: str) -> Node:
        if type(i) is not int or not 0 <= i < len(nodes):
            self.fail(f"{what} reference {i!r} is not an earlier node")
        return nodes[i]

    def _node(self, item: dict, nodes: list, i: int) -> Node:
        op = item["op"]
        if op not in _ARITY:
            self.fail(f"node {i}: unknown op {op!r} (primitives: {', '.join(PRIMITIVES)}; data: {', '.join(DATA_OPS)})")
        srcs = tuple((self._ref(nodes, s, f"node {i} source"), self._view(v)) for s, v in item["srcs"])
        if len(srcs) != _ARITY[op]:
            self.fail(f"node {i}: {op} takes {_ARITY[op]} sources, got {len(srcs)}")
        axis, name, value = item["axis"], item["name"], item["value"]
        if axis is not None and type(axis) is not int:
            self.fail(f"node {i}: axis must be an int or null")
        if (op == "input") != isinstance(name, str):
            self.fail(f"node {i}: an input (and only an input) has a name")
        if isinstance(value, dict):
            value = self._arg(value["expr"])
        elif value is not None and not (isinstance(value, float) and math.isfinite(value)):
            self.fail(f"node {i}: a constant's value must be a finite float or an expression")
        if (op == "constant") != (value is not None):
            self.fail(f"node {i}: a constant (and only a constant) has a value")
        return Node(op, srcs, tuple(map(self._arg, item["shape"])), axis=axis, name=name,
                    dtype=dtypes.normalize(item["dtype"]), value=value)
