"""Kernel IR and lowering: from the primitive graph to loop nests over symbolic ranges.

A kernel computes one buffer: for every index (_d0, .., _dn) of its output shape it stores
`value`, an expression tree over

- ``Load(buffer, index, valid)``   read a buffer (converted to float32); 0.0 where `valid` is 0
- ``Const(value)``                 a float
- ``IndexValue(expr)``             an integer expression of the loop indices, as a float
- ``Apply(op, args)``              a primitive applied elementwise (ops.PRIMITIVES[op])
- ``Reduce(op, var, extent, body)`` accumulate `body` over var = 0..extent-1
- ``Select(cond, value)``          value where cond else 0.0 (padding of inlined producers)

Index and validity expressions are `symbolic.Expr`s over the loop variables and the graph's
dims, simplified when built. The IR says *what* each output element is; *how* the loops run
(order, tiling, vectorization, threads) is the backend's schedule, so the same IR serves the C
and CUDA renderers and is what the search rewrites.

Default fusion (no search): a node gets its own buffer (is "realized") when it is an input or a
graph output, is used more than once and is not cheap to recompute (more than a few ops, or it
holds a reduction), or holds an inlined reduction and is read more than once per element by its
consumer (a broadcast). Every other node is inlined into its consumers, read through composed
index math. So elementwise producers fuse into reductions (a matmul is one kernel, a quantized
weight dequantizes inside the matmul) and elementwise consumers fuse after them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..graph import DATA_OPS, Graph, Node
from ..ops import PRIMITIVES
from ..shape import ShapeTracker, flat_index, index_vars, numel, row_major_strides
from ..symbolic import Expr, Sum, Var, sym


@dataclass(frozen=True)
class Load:
    buffer: int
    index: Expr
    valid: Expr


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class IndexValue:
    expr: Expr


@dataclass(frozen=True)
class Apply:
    op: str
    args: tuple


@dataclass(frozen=True)
class Reduce:
    op: str
    var: Var
    extent: Expr
    body: object


@dataclass(frozen=True)
class Select:
    cond: Expr
    value: object


@dataclass(frozen=True)
class Gather:
    """`body` with `var` bound to the value of `index` (an IR float expression): 0.0 unless that
    value is an integer in 0..extent-1. What a one-hot reduction (an embedding) becomes."""
    var: Var
    index: object
    extent: Expr
    body: object


@dataclass(frozen=True)
class Buffer:
    id: int
    numel: Expr
    dtype: str  # storage dtype; everything but inputs is float32, except int8-valued temps (int8_valued)
    kind: str  # "input" | "temp" | "output"
    name: str


@dataclass
class Kernel:
    name: str
    out: int  # buffer id written, row-major over `shape`
    shape: tuple[Expr, ...]
    value: object  # IR expression of the element at index vars _d0.._dn

    @property
    def loop_vars(self) -> list[Expr]:
        return index_vars(self.shape)


@dataclass
class KernelProgram:
    buffers: list[Buffer]
    kernels: list[Kernel]
    inputs: dict[str, int]  # input name -> buffer id
    outputs: dict[str, int]  # output name -> buffer id
    output_shapes: dict[str, tuple[Expr, ...]]
    dims: list[str] = field(default_factory=list)  # symbolic dim names, in the order the entry point takes them


def children(e) -> tuple:
    """The IR expressions directly under `e`."""
    if isinstance(e, Apply):
        return e.args
    return (e.body,) if isinstance(e, Reduce) else (e.value,) if isinstance(e, Select) else \
        (e.index, e.body) if isinstance(e, Gather) else ()


def walk(expr, skip=()):
    """Every IR node of an expression, parents before children, except the subtrees in `skip`
    (those a renderer has already named)."""
    if expr in skip:
        return
    yield expr
    for c in children(expr):
        yield from walk(c, skip)


def depends_on(e) -> frozenset:
    """The index variables (and dims) an IR expression reads."""
    if isinstance(e, Load):
        return e.index.vars() | e.valid.vars()
    if isinstance(e, IndexValue):
        return e.expr.vars()
    if isinstance(e, Select):
        return e.cond.vars() | depends_on(e.value)
    if isinstance(e, Apply):
        return frozenset().union(*(depends_on(a) for a in e.args))
    if isinstance(e, (Reduce, Gather)):
        outer = depends_on(e.index) if isinstance(e, Gather) else frozenset()
        return (depends_on(e.body) - {e.var.name}) | outer | e.extent.vars()
    return frozenset()


def loads(expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


def substitute(e, mapping: dict):
    """The IR expression with index variables replaced (by name) and trivial parts folded:
    loads and selects whose validity became 0 read 0.0, validity 1 disappears."""
    if isinstance(e, Load):
        valid = e.valid.substitute(mapping)
        return Const(0.0) if valid == sym(0) else Load(e.buffer, e.index.substitute(mapping), valid)
    if isinstance(e, IndexValue):
        return IndexValue(e.expr.substitute(mapping))
    if isinstance(e, Select):
        cond, value = e.cond.substitute(mapping), substitute(e.value, mapping)
        return Const(0.0) if cond == sym(0) or value == Const(0.0) else value if cond == sym(1) else Select(cond, value)
    if isinstance(e, Apply):
        return apply(e.op, *(substitute(a, mapping) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.var, e.extent.substitute(mapping), substitute(e.body, mapping))
    if isinstance(e, Gather):
        return Gather(e.var, substitute(e.index, mapping), e.extent.substitute(mapping), substitute(e.body, mapping))
    return e


def apply(op: str, *args):
    """Apply(op, args) with the identities that keep generated code lean (x + 0, x * 1)."""
    identity = {"add": Const(0.0), "mul": Const(1.0)}.get(op)  # (both binary)
    if identity is not None and identity in args:
        return args[0] if args[1] == identity else args[1]
    return Apply(op, tuple(args))


TRANSCENDENTAL = ("exp2", "log2", "sin", "sqrt", "recip")  # ops worth storing rather than recomputing per read
RECOMPUTE_MAX_OPS = 4  # a node this cheap is recomputed by each user instead of stored
INDEX_ONLY_MAX_OPS = 32  # the same for nodes that read no buffer (masks from index compares)
UNROLL_REDUCE_MAX = 4  # reductions this short become straight-line code (relu = max over [x, 0])


def unroll_short_reduction(e: Reduce):
    """Reduce over a tiny constant extent as a chain of combines, each body specialized (so the
    padding that built the reduced axis folds away)."""
    if not (isinstance(e, Reduce) and e.extent.is_const and e.extent.value <= UNROLL_REDUCE_MAX):
        return e
    if e.extent.value == 0:
        return Const(PRIMITIVES[e.op].identity)
    parts = [substitute(e.body, {e.var.name: k}) for k in range(e.extent.value)]
    # a reduce primitive's C spelling is its combine
    return functools.reduce(lambda out, part: Apply(e.op, (out, part)), parts)


def _ir_exprs(e, skip=()):
    """Every index/validity expression inside an IR tree (outside the subtrees in `skip`)."""
    for node in walk(e, skip):
        if isinstance(node, Load):
            yield node.index
            yield node.valid
        elif isinstance(node, IndexValue):
            yield node.expr
        elif isinstance(node, Select):
            yield node.cond


def _divisors_of(var: str, exprs) -> set[int]:
    """Constants c such that `var` appears under a `// c` or `% c`."""
    from ..symbolic import FloorDiv, Mod
    def divided(e):  # var itself is under a div/mod inside e
        return isinstance(e, (FloorDiv, Mod)) and var in e.a.vars() or any(divided(c) for c in e.children)

    found, stack = set(), list(exprs)
    while stack:
        e = stack.pop()
        if isinstance(e, (FloorDiv, Mod)) and e.b.is_const and e.b.value > 1 and var in e.a.vars() \
                and not divided(e.a):  # digits of var itself, not of var // 16 (those follow)
            found.add(e.b.value)
        stack.extend(e.children)
    return found


def digits(name: str, extent: int, exprs) -> tuple[list, Expr] | None:
    """A loop variable whose index math divides it by constants (r // 32, r % 16: blocks of a
    quantized weight, a convolution's window digits) as nested variables, innermost first, and
    itself as their sum (r = a*32 + b*16 + c), so every index becomes affine again; None when
    nothing divides it."""
    chain = []
    for c in sorted(_divisors_of(name, exprs)):
        if extent % c == 0 and all(c % prev == 0 for prev in chain):
            chain.append(c)
    if not chain:
        return None
    sizes = [b // a for a, b in zip([1] + chain, chain + [extent])]  # innermost digit first
    ds = [Var(f"{name}_{k}", 0, n - 1) for k, n in enumerate(sizes)]
    return ds, sum((d * scale for d, scale in zip(ds, [1] + chain)), sym(0))


def split_reductions(e):
    """Every reduction of `e` (innermost first) as a reduction over the digits of its variable
    (see `digits`), the innermost digit vectorizable.

    Done when a schedule renders the reduction as loops: the lowered IR keeps each reduction
    whole (one variable over its full extent), which is what tiled schedules need to pack it."""
    e = rebuild(e, split_reductions)
    split = digits(e.var.name, e.extent.value, _ir_exprs(e.body)) if isinstance(e, Reduce) and e.extent.is_const \
        else None
    if split is None:
        return e
    body = substitute(e.body, {e.var.name: split[1]})
    for d in split[0]:
        body = unroll_short_reduction(Reduce(e.op, d, sym(d.bounds()[1] + 1), body))
    return body


def rebuild(e, change):
    """`e` with `change` applied to each of its IR children (index expressions are kept)."""
    if isinstance(e, Apply):
        return Apply(e.op, tuple(map(change, e.args)))
    if isinstance(e, Select):
        return Select(e.cond, change(e.value))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.var, e.extent, change(e.body))
    return Gather(e.var, change(e.index), e.extent, change(e.body)) if isinstance(e, Gather) else e


def canonical_form(kernel: Kernel, offsets: bool = True) -> tuple[Kernel, list[int]]:
    """The kernel with its buffers renumbered 0, 1, .. in order of first use (the output last if
    not read) and its reduction and gather variables renamed _r0, _r1, .. in order, plus the
    original buffer ids by new number: the one canonical form of a kernel. Kernels that differ
    only in which buffers they touch (a model's repeated layers) get equal forms, so a backend
    renders their code once; with `offsets` False the constant offsets of loads are dropped too
    (layer k of a stacked cache reads at another offset but schedules the same), which is how
    the search deduplicates kernels."""
    ids: list[int] = []
    value = _canonical(kernel.value, ids, {}, offsets)
    if kernel.out not in ids:
        ids.append(kernel.out)
    return Kernel(kernel.name, ids.index(kernel.out), kernel.shape, value), ids


def same(a, b) -> bool:
    """Whether two IR expressions are equal up to the names of their reduction and gather
    variables (the same scores inlined twice get different names for their dot product's index)."""
    return _canonical(a, None, {}) == _canonical(b, None, {})


def _canonical(e, ids: list | None, names: dict, offsets: bool = True):
    """`e` with its loop variables renamed in order and (when `ids` is a list) its buffers numbered."""
    def expr(x: Expr) -> Expr:
        return x.substitute(names) if names else x

    if isinstance(e, Load):
        index = expr(e.index)
        index = index if offsets or not isinstance(index, Sum) else index - index.const
        if ids is not None and e.buffer not in ids:
            ids.append(e.buffer)
        return Load(ids.index(e.buffer) if ids is not None else e.buffer, index, expr(e.valid))
    if isinstance(e, IndexValue):
        return IndexValue(expr(e.expr))
    if isinstance(e, Select):
        return Select(expr(e.cond), _canonical(e.value, ids, names, offsets))
    if isinstance(e, Apply):
        return Apply(e.op, tuple(_canonical(a, ids, names, offsets) for a in e.args))
    if isinstance(e, (Reduce, Gather)):
        index = _canonical(e.index, ids, names, offsets) if isinstance(e, Gather) else None
        var = names.get(e.var.name) or Var(f"_r{len(names)}", *e.var.bounds())  # (a shared row value: one name)
        names[e.var.name] = var
        body = _canonical(e.body, ids, names, offsets)
        if isinstance(e, Gather):
            return Gather(var, index, expr(e.extent), body)
        return Reduce(e.op, var, expr(e.extent), body)
    return e


def _one_minus_less_than(e):
    """(a, b) when e is 1 - less_than(a, b), as GraphTensor.le/ge spell it; else None."""
    if isinstance(e, Apply) and e.op == "add" and e.args[0] == Const(1.0):
        m = e.args[1]
        if isinstance(m, Apply) and m.op == "mul" and m.args[1] == Const(-1.0) \
                and isinstance(m.args[0], Apply) and m.args[0].op == "less_than":
            return m.args[0].args
    return None


def gather_one_hot(e: Reduce):
    """sum over r of (X == r) * f(r) is f(X): a one-hot product (embedding, gather, index_select)
    becomes one indexed read instead of a pass over every r. X == r is GraphTensor.eq's
    (1 - (X < r)) * (1 - (r < X))."""
    if not (isinstance(e, Reduce) and e.op == "sum_reduce" and isinstance(e.body, Apply) and e.body.op == "mul"):
        return e
    r = IndexValue(e.var)
    for indicator, rest in ((e.body.args[0], e.body.args[1]), (e.body.args[1], e.body.args[0])):
        if not (isinstance(indicator, Apply) and indicator.op == "mul"):
            continue
        p, q = (_one_minus_less_than(a) for a in indicator.args)
        if p is None or q is None or tuple(p) != tuple(q)[::-1]:
            continue
        x = p[0] if p[1] == r else p[1] if p[0] == r else None
        if x is not None and e.var.name not in depends_on(x):
            return Gather(e.var, x, e.extent, rest)
    return e


class Lowering:
    """One lowering of a graph: which nodes get a buffer (`realized`, decided when constructed;
    node ids in `inline` never do unless they are inputs or outputs), then `run` for the kernels.
    `buffer_of` maps a realized node's id to its buffer once run."""

    def __init__(self, graph: Graph, inline: frozenset = frozenset()):
        self.graph = graph
        self.buffers: list[Buffer] = []
        self.buffer_of: dict[int, int] = {}  # node id -> buffer id
        self.kernels: list[Kernel] = []
        self.reduce_vars = 0
        self.reductions: dict = {}  # (node id, index, guard) -> its IR
        self.uses: dict[int, list] = {}
        for n in graph.nodes:
            for src, tracker in n.srcs:
                self.uses.setdefault(src.id, []).append((n, tracker))
        output_nodes = {node.id for node, _ in graph.outputs.values()}
        fixed = {n.id for n in graph.nodes if n.op == "input" or n.id in output_nodes}
        # A node holding row values that a consumer reads out of row order gets a buffer if that
        # consumer reads it more than once (a matmul: normalized rows are stored once); if it reads
        # each element once (a reduction over other axes, a transpose), the row values themselves
        # get buffers instead, and the decisions are made again.
        while not (rows := self.decide(fixed, inline)) <= fixed:
            fixed |= rows

    def decide(self, fixed: set, inline) -> set:
        """Set `realized` (and `row_values`) from the nodes that must be realized; return the row
        values found that should be realized as well."""
        self.realized, rows = set(fixed), set()
        # Decided in topological order, since a node's cost depends on what its sources inline:
        # - a node used more than once is recomputed by each user if it is a few ops and holds no
        #   reduction (cheaper than a round trip through memory) -- and, if it holds a
        #   transcendental, only when its users all walk rows (one row kernel) --, else it gets a buffer;
        # - an inlined node computes every reduction and transcendental (sin, exp2, ...) inlined
        #   beneath it once per element read, so if its consumer reads elements more than once (a
        #   broadcast, e.g. RoPE'd queries against every key), it gets a buffer;
        # - except a row broadcast (a per-row value read along the last axis: a norm's mean, a
        #   softmax's max and sum): that is inlined as a *row value*, which the renderer computes
        #   once per row before the loop over the row (a norm or softmax is then one kernel whose
        #   row stays in cache). A node holding row values is inlined only where that loop stays
        #   innermost: read in order by elementwise ops or by a reduction over the last axis.
        # - a node that reads no buffer (index arithmetic: a causal mask) is recomputed up to
        #   INDEX_ONLY_MAX_OPS ops: a few integer compares cost less than an S x S buffer;
        # - a node both maxed and compared (amax's gradient: x == max(x)) gets a buffer: recomputed
        #   in two kernels, C's reassociation rounded x * x * r differently (no maximum found: 0/0).
        holds_reduce, transcendental, cost, reads = {}, {}, {}, {}
        row_srcs: dict[int, set] = {}  # node id -> the row values it inlines (empty: it holds none)
        for n in self.graph.nodes:
            holds_reduce[n.id] = bool(n.primitive and n.primitive.kind == "reduce")
            transcendental[n.id] = n.op in TRANSCENDENTAL
            cost[n.id], row_srcs[n.id] = n.op not in DATA_OPS, set()
            reads[n.id] = n.op == "input" or any(src.id in self.realized or reads[src.id] for src, _ in n.srcs)
            for src, tracker in n.srcs:
                if src.id in self.realized:
                    continue
                if _row_broadcast(tracker, src.shape):  # computed per row, not per element of n
                    row_value = holds_reduce[src.id] or bool(row_srcs[src.id])
                    row_srcs[n.id] |= {src.id} if row_value else set()
                    # (a sin without a reduction is no row value: each element of n recomputes it)
                    transcendental[n.id] |= transcendental[src.id] and not row_value
                    continue
                holds_reduce[n.id] |= holds_reduce[src.id]
                cost[n.id] += cost[src.id]
                transcendental[n.id] |= transcendental[src.id]
                row_srcs[n.id] |= row_srcs[src.id]
            n_uses = self.uses.get(n.id, ())
            if n.op == "constant" or n.id in self.realized or n.id in inline:
                continue
            out_of_order = [use for use in n_uses if not _keeps_rows(*use, n)]
            if len(n_uses) > 1 and (holds_reduce[n.id] or cost[n.id] > (RECOMPUTE_MAX_OPS if reads[n.id] else
                                                                        INDEX_ONLY_MAX_OPS)
                                    or transcendental[n.id] and out_of_order or {"max_reduce", "less_than"} <= {c.op for c, _ in n_uses}):
                self.realized.add(n.id)
            elif len(n_uses) == 1 and (holds_reduce[n.id] or transcendental[n.id]) \
                    and _read_more_than_once(n, n_uses) and out_of_order:
                self.realized.add(n.id)
            elif int8_valued(n) and any(_read_more_than_once(n, [use]) for use in n_uses):
                self.realized.add(n.id)  # stored once as bytes, not recomputed in float per read
            elif row_srcs[n.id] and out_of_order:
                if any(_read_more_than_once(n, [use]) for use in out_of_order):
                    self.realized.add(n.id)
                else:
                    rows |= row_srcs[n.id]
        self.row_values = row_srcs
        return rows

    def new_buffer(self, numel, dtype, kind, name) -> int:
        self.buffers.append(Buffer(len(self.buffers), numel, dtype, kind, name))
        return len(self.buffers) - 1

    def run(self) -> KernelProgram:
        g = self.graph
        inputs = {name: self.new_buffer(numel(n.shape), n.dtype, "input", name) for name, n in g.inputs.items()}
        self.buffer_of.update({n.id: inputs[name] for name, n in g.inputs.items()})
        outputs, shapes = {}, {}
        direct = {}  # node id -> output name whose buffer is the node's own
        for name, (node, tracker) in g.outputs.items():
            if node.op != "input" and node.id in self.realized and node.id not in direct \
                    and tracker == ShapeTracker.contiguous(node.shape):
                direct[node.id] = name
        for n in g.nodes:
            if n.id in self.realized and n.op != "input":
                kind, name = ("output", direct[n.id]) if n.id in direct else ("temp", f"t{n.id}")
                buf = self.new_buffer(numel(n.shape), "int8" if kind == "temp" and int8_valued(n) else "float32", kind,
                                      name)
                value = self.value(n, index_vars(n.shape), sym(1), root=True)
                self.kernels.append(Kernel(f"k{len(self.kernels)}_{n.op}", buf, n.shape, value))
                self.buffer_of[n.id] = buf
        for name, (node, tracker) in g.outputs.items():
            shapes[name] = tracker.shape
            if direct.get(node.id) == name:
                outputs[name] = self.buffer_of[node.id]
                continue
            buf = self.new_buffer(numel(tracker.shape), "float32", "output", name)
            value = self.read(node, tracker, index_vars(tracker.shape), sym(1))
            self.kernels.append(Kernel(f"k{len(self.kernels)}_out_{name}", buf, tracker.shape, value))
            outputs[name] = buf
        return KernelProgram(self.buffers, self.kernels, inputs, outputs, shapes, sorted(g.dims()))

    def read(self, src: Node, tracker: ShapeTracker, idx, guard: Expr):
        """The value of `src` seen through `tracker` at index `idx` (0 where the view or `guard` is invalid)."""
        own = tracker.valid_expr(idx)
        valid = guard & own
        flat = tracker.index_expr(idx)
        if src.id in self.realized:
            return Load(self.buffer_of[src.id], flat, valid)  # loads carry every guard: memory safety
        multi = _source_index(tracker, src.shape, idx)
        if multi is None:  # recover the source's own index from the flat position (div/mod, simplified)
            multi = [(flat // s) % d for s, d in zip(row_major_strides(src.shape), src.shape)]
        value = self.value(src, multi, valid)
        # only padding this view adds needs a Select; an enclosing guard is applied by whoever set it
        return value if own == sym(1) or isinstance(value, Load) else Select(valid, value)

    def value(self, node: Node, idx, guard: Expr, root: bool = False):
        """The element of `node` at index `idx`: a Load if it has a buffer, else its inlined expression."""
        if node.id in self.realized and not root:
            return Load(self.buffer_of[node.id], flat_index(idx, node.shape), guard)
        if node.op == "constant":
            if isinstance(node.value, float):
                return Const(node.value)
            return IndexValue(node.value.substitute({f"_d{k}": i for k, i in enumerate(idx)}))
        if node.op == "contiguous":
            return self.read(*node.srcs[0], idx, guard)
        prim = node.primitive
        if prim.kind == "reduce":
            key = (node.id, tuple(idx), guard)  # one IR node per reduction: a row value read twice is computed once
            if key not in self.reductions:
                self.reductions[key] = self.reduction(node, idx, guard)
            return self.reductions[key]
        return apply(prim.name, *(self.read(s, t, idx, guard) for s, t in node.srcs))

    def reduction(self, node: Node, idx, guard: Expr):
        src, tracker = node.srcs[0]
        extent = tracker.shape[node.axis]
        var = Var(f"_r{self.reduce_vars}", 0, max(extent.value - 1, 0) if extent.is_const else None)
        self.reduce_vars += 1
        src_idx = list(idx[:node.axis]) + [var] + list(idx[node.axis:])
        reduction = Reduce(node.op, var, extent, self.read(src, tracker, src_idx, guard))
        return unroll_short_reduction(gather_one_hot(reduction))


def int8_valued(n: Node) -> bool:
    """Whether `n` is trunc(fmod(y, c)), 0 < |c| <= 128, as the library spells trunc (t + fmod(t, 1)
    * -1, t = fmod(y, c)): an integer in [-127, 127] for every finite y -- an activation quantized
    to int8 (io/quant.py), stored as int8 so that its consumers load exact integers."""
    def constant(edge):
        return edge[0].value if edge[0].op == "constant" and isinstance(edge[0].value, float) else None
    if n.op != "add" or n.srcs[1][0].op != "mul" or constant(n.srcs[1][0].srcs[1]) != -1.0:
        return False
    frac, t = n.srcs[1][0].srcs[0][0], n.srcs[0][0]
    return frac.op == "mod" and frac.srcs[0] == n.srcs[0] and constant(frac.srcs[1]) == 1.0 and t.op == "mod" \
        and 0 < abs(constant(t.srcs[1]) or 0) <= 128


def _read_more_than_once(node: Node, uses) -> bool:
    """Whether the (single) consumer may read an element of `node` more than once: anything but
    an in-order read of the same shape (a broadcast, a window) - or a Contiguous copy of it."""
    consumer, tracker = uses[0]
    return consumer.op == "contiguous" or not (tracker.is_contiguous() and tracker.shape == node.shape)


def _row_broadcast(tracker: ShapeTracker, shape) -> bool:
    """Whether `tracker` reads a buffer of `shape` in order, each element repeated along a new
    (or size-1) last axis of more than one element: how a row's mean or max meets the row."""
    if tracker.ndim < 1 or tracker.strides[-1] != sym(0) or tracker.shape[-1] == sym(1) or tracker.valid != sym(1):
        return False
    rows = ShapeTracker(tracker.shape[:-1], tracker.strides[:-1], tracker.offset, sym(1))
    return rows.is_contiguous() and numel(rows.shape) == numel(shape)


def _keeps_rows(consumer: Node, tracker: ShapeTracker, node: Node) -> bool:
    """Whether `consumer` reading `node` (which holds row values) keeps the row loop innermost."""
    if _row_broadcast(tracker, node.shape):
        return True
    last = lambda shape: ([d for d in shape if d != sym(1)] or [sym(1)])[-1]  # noqa: E731
    if not (tracker.is_contiguous() and numel(tracker.shape) == numel(node.shape)
            and last(tracker.shape) == last(node.shape)):  # in order, rows kept whole
        return False
    prim = consumer.primitive
    return prim is not None and (prim.kind != "reduce" or consumer.axis == tracker.ndim - 1)


def _source_index(tracker: ShapeTracker, shape, idx) -> list | None:
    """The index into a row-major `shape` that `tracker` reads at `idx`, dimension by dimension,
    when the view only permutes, broadcasts and slices whole dimensions (no merged dims); else None.

    Going through the flat position instead costs a div/mod per dim that the simplifier cannot
    remove for symbolic sizes, so this is the path that keeps inlined views cheap.
    """
    if tracker.valid != sym(1):  # with padding the offset no longer splits into in-range starts
        return None
    strides = row_major_strides(shape)
    live = {k for k, d in enumerate(shape) if d != sym(1)}
    owner: dict[int, tuple[int, int]] = {}  # source dim -> (view dim, step)
    for c, (stride, size) in enumerate(zip(tracker.strides, tracker.shape)):
        if stride == sym(0) or size == sym(1):
            continue
        match = [k for k in live if stride == strides[k]] or [
            k for k in live if strides[k].is_const and stride.is_const and strides[k].value > 0
            and stride.value % strides[k].value == 0]
        if len(match) != 1 or match[0] in owner:
            return None
        k = match[0]
        step = (stride // strides[k]).value if stride.is_const else 1
        # the view dim must stay inside source dim k (else it spans several: a merged reshape)
        if not (size == shape[k] and abs(step) == 1 or size.is_const and shape[k].is_const
                and (size.value - 1) * abs(step) < shape[k].value):
            return None
        owner[k] = (c, step)
    multi, offset = [], tracker.offset
    for k in range(len(shape)):  # peel the offset into per-dim starts, outermost first
        start = offset // strides[k] if k in live else sym(0)
        offset = offset - start * strides[k]
        c, step = owner.get(k, (None, 1))
        multi.append(start if c is None else start + idx[c] * step)
    return multi if offset == sym(0) else None


def lower(graph: Graph, inline: frozenset = frozenset()) -> KernelProgram:
    """Partition `graph` into kernels (default fusion; node ids in `inline` are never given a
    buffer unless they are inputs or outputs) and express each as IR."""
    return Lowering(graph, inline).run()
