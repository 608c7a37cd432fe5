"""Generic passes on the primitive graph: dead-node removal, CSE, constant folding, cleanup.

Every pass is a function ``Graph -> Graph`` that returns a NEW graph and never touches the
one it was given (the user may keep building it or compile it again). The new graph keeps
every declared input, even unused ones (callers still pass them and they are validated), and
the same output names.

The rewriting passes share one walk (`_rewrite`): nodes are copied in topological order and a
rule may say "this node's value equals node X read through tracker T" (an *alias*). Consumers
of the node then read X directly, but only when the two views compose into one tracker
(`compose`); otherwise they keep reading the copy. Whatever ends up unused is pruned, so each
pass leaves no dead nodes behind.

Rewrites follow the primitives' IEEE float32 semantics, with two deliberate exceptions that
every compiler makes: re-associating constants ((x*c1)*c2 -> x*(c1*c2)) may round differently
or avoid an intermediate overflow, and recip(recip(x)) -> x ignores that 1/x overflows for
denormal x. x*0 is never folded to 0 (inf*0 and nan*0 are nan).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import UnsupportedError
from ..graph import Graph, Node
from ..shape import ShapeTracker
from ..symbolic import sym

Edge = tuple[Node, ShapeTracker]  # a node read through a view, as in Node.srcs
Alias = tuple[Node, "ShapeTracker | None"]  # what a node's value equals; None: that node as it is
Rule = Callable[["_Builder", Node], "Alias | None"]
ZERO, ONE = sym(0), sym(1)


# -- views --------------------------------------------------------------------------------------
def is_plain(tracker: ShapeTracker, shape) -> bool:
    """True when `tracker` reads a buffer of `shape` exactly as it is (same shape, row-major)."""
    return tracker.shape == tuple(shape) and tracker.is_contiguous()


def compose(inner: Alias, outer: ShapeTracker, shape) -> Edge | None:
    """Reading `inner` (a value of `shape`) through `outer`, as one edge; None if not expressible.

    ShapeTrackers cannot compose in general, so only the easy cases: either view is the
    identity, or `inner` repeats a single element (then `outer` only contributes its shape and
    its padding mask).
    """
    node, tracker = inner
    if tracker is None or is_plain(tracker, node.shape):
        return node, outer
    if is_plain(outer, shape):
        return inner
    if tracker.valid == ONE and all(s == ZERO for s in tracker.strides):
        return node, ShapeTracker(outer.shape, (ZERO,) * outer.ndim, tracker.offset, outer.valid)
    return None


def scalar_of(edge: Edge) -> float | None:
    """The number every element of `edge` equals, if it reads a constant without padding."""
    node, tracker = edge
    if node.op != "constant" or tracker.valid != ONE:
        return None  # padded positions read 0, so a padded constant is not uniform
    if isinstance(node.value, float):
        return node.value
    return float(node.value.value) if node.value.is_const else None


# -- the shared rewriting walk ------------------------------------------------------------------
class _Builder:
    """A new graph being built from an old one: each old node maps to its copy and maybe an alias."""

    def __init__(self):
        self.graph = Graph()
        self.copy_of: dict[int, Node] = {}  # id(old node) -> its copy in the new graph
        self.alias_of: dict[int, Alias] = {}  # id(old node) -> what has the same value

    def edge(self, old: Node, tracker: ShapeTracker) -> Edge:
        """Where a consumer that read `old` through `tracker` reads in the new graph."""
        alias = self.alias_of.get(id(old))
        if alias is not None:
            composed = compose(alias, tracker, old.shape)
            if composed is not None:
                return composed
        return self.copy_of[id(old)], tracker

    def scalar(self, value: float, shape) -> Edge:
        """A new float constant `value` seen over `shape` (it may be inf or nan: folded, not user input)."""
        shape = tuple(shape)
        node = self.graph.add(Node("constant", (), (), value=float(value)))
        return node, ShapeTracker(shape, (ZERO,) * len(shape), ZERO, ONE)  # the one element, repeated


def _rewrite(graph: Graph, rule: Rule | None) -> Graph:
    """Copy `graph` in topological order, letting `rule` alias nodes; prune what became unused."""
    b = _Builder()
    for old in graph.nodes:
        srcs = tuple(b.edge(src, tracker) for src, tracker in old.srcs)
        new = b.graph.add(Node(old.op, srcs, old.shape, old.axis, old.name, old.dtype, old.value))
        b.copy_of[id(old)] = new
        if old.op == "input":
            b.graph.inputs[old.name] = new
        elif rule is not None:
            alias = rule(b, new)
            if alias is not None:
                b.alias_of[id(old)] = alias
    b.graph.outputs = {name: b.edge(node, tracker) for name, (node, tracker) in graph.outputs.items()}
    b.graph.updates = dict(graph.updates)
    return _prune(b.graph) if rule is not None else b.graph


def _prune(graph: Graph) -> Graph:
    """Drop, in place, the nodes no output depends on (inputs stay); used on graphs a pass owns."""
    live, stack = set(), [node for node, _ in graph.outputs.values()]
    while stack:
        node = stack.pop()
        if id(node) not in live:
            live.add(id(node))
            stack.extend(src for src, _ in node.srcs)
    graph.nodes = [n for n in graph.nodes if id(n) in live or n.op == "input"]
    for k, node in enumerate(graph.nodes):
        node.id = k
    return graph


# -- the passes ---------------------------------------------------------------------------------
def dce(graph: Graph) -> Graph:
    """Dead-node removal: keep the nodes some output depends on, plus every declared input."""
    return _prune(_rewrite(graph, None))


class _ViewTokens:
    """Small ints standing for views: equal trackers get the same number, and each tracker object
    is hashed only once (hashing a tracker hashes every expression in it; most edges of a graph
    share a handful of tracker objects)."""

    def __init__(self):
        self.by_object: dict[int, tuple] = {}  # id(tracker) -> (tracker, token): kept alive, so ids stay unique
        self.by_value: dict[ShapeTracker, int] = {}

    def token(self, tracker: ShapeTracker) -> int:
        hit = self.by_object.get(id(tracker))
        if hit is None:
            hit = self.by_object[id(tracker)] = (tracker, self.by_value.setdefault(tracker, len(self.by_value)))
        return hit[1]


def _cse_key(node: Node, views: _ViewTokens):
    """What makes two nodes compute the same value (sources by identity and view)."""
    srcs = tuple((src.id, views.token(tracker)) for src, tracker in node.srcs)
    if node.op in ("add", "mul"):  # commutative: a+b and b+a are one value (a multiset of edges)
        srcs = frozenset(Counter(srcs).items())
    value = node.value.hex() if isinstance(node.value, float) else node.value  # keeps 0.0 != -0.0
    return node.op, srcs, node.shape, node.axis, value, node.name, node.dtype


def cse(graph: Graph) -> Graph:
    """Common-subexpression elimination: identical nodes (same op, sources, views, attributes)
    are computed once; the first one in graph order is kept. Inputs are never merged."""
    seen: dict = {}
    views = _ViewTokens()

    def merge(b: _Builder, node: Node) -> Alias | None:
        first = seen.setdefault(_cse_key(node, views), node)
        return None if first is node else (first, None)
    return _rewrite(graph, merge)


def _fold_rule(b: _Builder, node: Node) -> Alias | None:
    scalars = [scalar_of(edge) for edge in node.srcs]
    if not scalars or any(c is None for c in scalars):
        return None
    if node.op == "contiguous":
        return b.scalar(scalars[0], node.shape)
    prim = node.primitive  # (every node with sources but Contiguous is a primitive)
    if prim.kind != "reduce":
        value = prim.reference(*(np.float32(c) for c in scalars))
        return b.scalar(float(value), node.shape)
    n = node.srcs[0][1].shape[node.axis]
    if not n.is_const:
        return None
    if n.value == 0:
        return b.scalar(prim.identity, node.shape)
    (c,) = scalars
    return b.scalar(float(np.float32(c) * np.float32(n.value)) if node.op == "sum_reduce" else c, node.shape)


def fold(graph: Graph) -> Graph:
    """Constant folding: a primitive (or Contiguous) whose sources are all uniform constants
    becomes a constant, computed with the primitive's own reference implementation. A
    reduction over a uniform constant c along an axis of known length n gives c*n (sum) or c
    (max); over an empty axis, the reduction's identity."""
    return _rewrite(graph, _fold_rule)


_UNIT = {"add": 0.0, "mul": 1.0}


def _simplify_rule(b: _Builder, node: Node) -> Alias | None:
    srcs = node.srcs
    if node.op == "contiguous" and is_plain(srcs[0][1], srcs[0][0].shape):
        return srcs[0]  # already row-major: nothing to materialize
    if node.op == "recip" and srcs[0][0].op == "recip":
        inner = srcs[0][0]
        return compose(inner.srcs[0], srcs[0][1], inner.shape)  # 1/(1/x) = x
    if node.op in ("sum_reduce", "max_reduce") and srcs[0][1].shape[node.axis] == ONE:
        tracker = srcs[0][1].reshape(node.shape)  # reducing a single element keeps it
        return None if tracker is None else (srcs[0][0], tracker)
    if node.op in _UNIT:
        for mine, other in ((0, 1), (1, 0)):
            c = scalar_of(srcs[mine])
            if c == _UNIT[node.op]:
                return srcs[other]  # x*1 = x, x+0 = x
            if c is not None:
                merged = _reassociate(b, node, srcs[other], c)
                if merged is not None:
                    return merged
    return None


def _reassociate(b: _Builder, node: Node, edge: Edge, c2: float) -> Alias | None:
    """(x op c1) op c2 -> x op (c1 op c2), for op in add/mul, when x's views compose."""
    inner, tracker = edge
    if inner.op != node.op:
        return None
    for mine, other in ((0, 1), (1, 0)):
        c1 = scalar_of(inner.srcs[mine])
        x = compose(inner.srcs[other], tracker, inner.shape) if c1 is not None else None
        if x is not None and scalar_of(x) is None:
            c = float(node.primitive.reference(np.float32(c1), np.float32(c2)))
            merged = b.graph.add(Node(node.op, (x, b.scalar(c, node.shape)), node.shape))
            return _simplify_rule(b, merged) or (merged, None)
    return None


def simplify(graph: Graph) -> Graph:
    """Algebraic cleanup: x*1 -> x, x+0 -> x, recip(recip(x)) -> x, (x*c1)*c2 -> x*(c1*c2),
    (x+c1)+c2 -> x+(c1+c2) (so -(-x) -> x), a reduction over a length-1 axis -> its element,
    Contiguous of an already row-major read -> its source. Constants count when uniform
    (a number seen through expand/reshape views)."""
    return _rewrite(graph, _simplify_rule)


PASSES: dict[str, Callable[[Graph], Graph]] = {"dce": dce, "cse": cse, "fold": fold, "simplify": simplify}
# CSE first exposes shared constants and subexpressions; the second CSE merges what folding
# and cleanup created (new constants, nodes that became equal).
DEFAULT_PIPELINE = ("cse", "fold", "simplify", "cse", "dce")


def optimize(graph: Graph, passes: Sequence[str] | None = None) -> Graph:
    """Run `passes` (names from PASSES, in order; None: DEFAULT_PIPELINE) on a copy of `graph`.

    `passes=[]` returns a plain copy. The input graph is never modified.
    """
    passes = DEFAULT_PIPELINE if passes is None else passes
    if isinstance(passes, str) or not isinstance(passes, Sequence):
        raise UnsupportedError(f"passes must be a list of pass names from {sorted(PASSES)}, got {passes!r}")
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise UnsupportedError(f"unknown compiler pass {unknown[0]!r}; available: {sorted(PASSES)}")
    result = graph
    for name in passes:
        if name == "dce" and result is not graph:
            continue  # every pass prunes what it leaves unused: dce would only copy the graph again
        result = PASSES[name](result)  # a new graph: passes never modify their input
    return _rewrite(graph, None) if result is graph else result  # a private copy, even when no pass runs
