"""GraphTensor: a lazy tensor in a Graph, with PyTorch's names and semantics.

Nothing is computed when you call a method: each call adds primitive nodes to the graph (or,
for view ops, only changes the ShapeTracker). This module holds the class, its view ops and
the direct wrappers of the primitives; the rest of the op library (library/*.py) is composed
from these and attached as methods at the bottom of this file.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import LuminarError, ShapeError, UnsupportedError
from .graph import Graph, Node, parse_dim, show_shape
from .shape import ShapeTracker, numel as shape_numel
from .symbolic import Expr, smax, smin, sym


def _public(d: Expr):
    return d.value if d.is_const else d


def is_int(v) -> bool:
    """An int or numpy integer, but not a bool: what sizes, dims and indices accept."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def normalize_dim(dim: int, ndim: int, what: str = "dim") -> int:
    """A possibly negative dim index as 0..ndim-1 (PyTorch rules: rank 0 accepts 0 and -1)."""
    n = max(ndim, 1)
    if not is_int(dim):
        raise ShapeError(f"{what} must be an int, got {dim!r}")
    if not -n <= dim < n:
        raise ShapeError(f"{what} {dim} is out of range for a tensor of rank {ndim} (expected {-n}..{n - 1})")
    return int(dim) % n


def broadcast_shapes(*shapes) -> tuple[Expr, ...]:
    """PyTorch broadcasting: align from the right; sizes must match or be 1."""
    ndim = max(len(s) for s in shapes)
    out = []
    for k in range(ndim):
        dims = {s[k - ndim + len(s)] for s in shapes if k - ndim + len(s) >= 0} - {sym(1)}
        if len(dims) > 1:
            raise ShapeError(f"shapes {', '.join(show_shape(s) for s in shapes)} cannot be broadcast together "
                             f"(axis {k - ndim}: sizes {', '.join(sorted(map(str, dims)))})")
        out.append(dims.pop() if dims else sym(1))
    return tuple(out)


class GraphTensor:
    """A node's result seen through a view: (graph, node, ShapeTracker)."""

    __array_priority__ = 1000  # so numpy scalars defer to our reflected operators

    def __init__(self, graph: Graph, node: Node, tracker: ShapeTracker):
        self.graph, self.node, self.tracker = graph, node, tracker

    # -- basic properties ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Ints where the size is known, symbolic expressions where it is bound at run time."""
        return tuple(_public(d) for d in self.tracker.shape)

    @property
    def dims(self) -> tuple[Expr, ...]:
        return self.tracker.shape

    @property
    def ndim(self) -> int:
        return self.tracker.ndim

    @property
    def dtype(self) -> str:
        return self.node.dtype

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[normalize_dim(dim, self.ndim)]

    def numel(self):
        return _public(self.tracker.numel)

    def dim(self) -> int:
        return self.ndim

    def __len__(self):
        if not self.ndim or not self.dims[0].is_const:
            raise ShapeError(f"len() needs a known first dimension, shape is {show_shape(self.dims)}")
        return self.dims[0].value

    def __repr__(self):
        return f"GraphTensor(shape={show_shape(self.dims)}, dtype={self.dtype}, node={self.node!r})"

    def __bool__(self):
        raise LuminarError("a GraphTensor has no value until the graph runs; it cannot be used as a bool")

    __hash__ = object.__hash__

    def output(self, name: str) -> GraphTensor:
        """Mark this tensor as a graph output called `name`; returns self."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ShapeError(f"output name must be an identifier, got {name!r}")
        self.graph.outputs[name] = (self.node, self.tracker)
        return self

    # -- construction helpers -----------------------------------------------------------------
    def _view(self, tracker: ShapeTracker) -> GraphTensor:
        return GraphTensor(self.graph, self.node, tracker)

    def _new(self, op: str, srcs, shape, axis=None) -> GraphTensor:
        node = self.graph.add(Node(op, tuple((t.node, t.tracker) for t in srcs), tuple(shape), axis=axis))
        return GraphTensor(self.graph, node, ShapeTracker.contiguous(shape))

    def _lift(self, other) -> GraphTensor:
        """A Python number (or 0-d array) as a scalar constant; tensors must share the graph."""
        if isinstance(other, GraphTensor):
            if other.graph is not self.graph:
                raise LuminarError("cannot combine tensors from different graphs")
            return other
        if isinstance(other, (bool, int, float, np.number)) or (isinstance(other, np.ndarray) and other.ndim == 0):
            return self.graph.constant(float(other))
        raise UnsupportedError(f"cannot combine a GraphTensor with {type(other).__name__}; "
                               f"declare arrays as graph inputs with g.tensor(...)")

    def contiguous(self) -> GraphTensor:
        """Materialize the view into a fresh row-major buffer (a Contiguous node)."""
        return self._new("contiguous", [self], self.dims)

    # -- primitives -----------------------------------------------------------------------------
    def _unary(self, op: str) -> GraphTensor:
        return self._new(op, [self], self.dims)

    def _binary(self, op: str, other, reverse=False) -> GraphTensor:
        other = self._lift(other)
        a, b = (other, self) if reverse else (self, other)
        shape = broadcast_shapes(a.dims, b.dims)
        return self._new(op, [a.broadcast_to(shape), b.broadcast_to(shape)], shape)

    def _reduce(self, op: str, dim=None, keepdim: bool = False) -> GraphTensor:
        """Reduce over `dim` (int, tuple, or None for all) one axis at a time, highest first."""
        if dim is None or (isinstance(dim, (tuple, list)) and not dim):  # PyTorch: () also means every dim
            dim = range(self.ndim)
        axes = (dim,) if isinstance(dim, (int, np.integer)) else dim
        axes = sorted({normalize_dim(d, self.ndim) for d in axes}, reverse=True)
        if self.ndim == 0:
            return self  # PyTorch: reducing a 0-d tensor returns its value
        out, merged_axes = _merge_adjacent(self, axes)
        for axis in merged_axes:
            out = out._new(op, [out], out.dims[:axis] + out.dims[axis + 1:], axis=axis)
        if keepdim:
            out = out.reshape(*[sym(1) if k in axes else d for k, d in enumerate(self.dims)])
        return out

    def exp2(self): return self._unary("exp2")
    def log2(self): return self._unary("log2")
    def sin(self): return self._unary("sin")
    def sqrt(self): return self._unary("sqrt")
    def reciprocal(self): return self._unary("recip")
    def add(self, other): return self._binary("add", other)
    def mul(self, other): return self._binary("mul", other)
    def fmod(self, other): return self._binary("mod", other)
    def less_than(self, other): return self._binary("less_than", other)

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, reverse=True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, reverse=True)
    def __neg__(self): return self * -1.0
    def __sub__(self, o): return self + (-self._lift(o))
    def __rsub__(self, o): return self._lift(o) + (-self)
    def __truediv__(self, o):
        o = self._lift(o)
        if o.node.op == "constant" and isinstance(o.node.value, float) and o.node.value != 0:
            return self * (1.0 / o.node.value)  # exact reciprocal of a known number
        return self * o.reciprocal()
    def __rtruediv__(self, o): return self._lift(o) * self.reciprocal()

    # -- the compositions everything else leans on ---------------------------------------------
    def lt(self, o): return self.less_than(o)
    def gt(self, o): return self._binary("less_than", o, reverse=True)
    def le(self, o): return 1.0 - self.gt(o)
    def ge(self, o): return 1.0 - self.lt(o)
    def eq(self, o): return (1.0 - self.lt(o)) * (1.0 - self.gt(o))
    def ne(self, o): return 1.0 - self.eq(o)
    __lt__, __gt__, __le__, __ge__, __eq__, __ne__ = lt, gt, le, ge, eq, ne

    def where(self, condition, other) -> GraphTensor:
        """PyTorch's x.where(cond, y): x where cond is non-zero, else y."""
        return where(condition, self, other)

    def exp(self): return (self * _LOG2_E).exp2()
    def log(self): return self.log2() * _LN_2

    def sum(self, dim=None, keepdim: bool = False): return self._reduce("sum_reduce", dim, keepdim)
    def amax(self, dim=None, keepdim: bool = False): return self._reduce("max_reduce", dim, keepdim)

    def matmul(self, other) -> GraphTensor:
        """torch.matmul: vectors, matrices and broadcast batches, as a broadcast multiply and a sum."""
        a, b = self, self._lift(other)
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError("matmul: both operands need at least one dimension (use * for scalars)")
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        if a2.dims[-1] != b2.dims[-2]:
            raise ShapeError(f"matmul: shapes {show_shape(a.dims)} and {show_shape(b.dims)} do not align "
                             f"({a2.dims[-1]} != {b2.dims[-2]})")
        # (..., n, 1, k) * (..., 1, m, k) summed over k: each output is a dot product of a row and a column
        out = (a2.unsqueeze(-2) * b2.mT.unsqueeze(-3)).sum(-1)
        if a.ndim == 1:
            out = out.squeeze(-2)
        if b.ndim == 1:
            out = out.squeeze(-1)
        return out

    __matmul__ = matmul
    def __rmatmul__(self, o): return self._lift(o).matmul(self)

    # -- view ops (no data moves) --------------------------------------------------------------
    def broadcast_to(self, shape) -> GraphTensor:
        shape = tuple(parse_dim(d) for d in shape)
        if shape == self.dims:
            return self
        if len(shape) < self.ndim or broadcast_shapes(self.dims, shape) != shape:
            raise ShapeError(f"cannot broadcast shape {show_shape(self.dims)} to {show_shape(shape)}")
        t = self.reshape(*([1] * (len(shape) - self.ndim) + list(self.dims)))
        return t._view(t.tracker.expand(shape))

    def expand(self, *sizes) -> GraphTensor:
        """PyTorch expand: -1 keeps a size; new leading dims may be added."""
        sizes = _sizes(sizes)
        lead = len(sizes) - self.ndim
        if lead < 0:
            raise ShapeError(f"expand: {len(sizes)} sizes given for a tensor of rank {self.ndim}")
        shape = [self.dims[k - lead] if (isinstance(s, int) and s == -1) else parse_dim(s)
                 for k, s in enumerate(sizes)]
        return self.broadcast_to(shape)

    def reshape(self, *shape) -> GraphTensor:
        """PyTorch reshape (one -1 allowed); a view when strides allow, else a Contiguous copy first."""
        shape = list(_sizes(shape))
        holes = [k for k, s in enumerate(shape) if isinstance(s, int) and s == -1]
        if len(holes) > 1:
            raise ShapeError(f"reshape: only one dimension can be -1, got {tuple(shape)}")
        dims = [sym(1) if k in holes else parse_dim(s) for k, s in enumerate(shape)]
        known_numel = shape_numel(dims)  # (the hole counts as 1)
        numel = self.tracker.numel
        if holes:
            if known_numel == sym(0):
                raise ShapeError(f"reshape: cannot infer -1 for shape {tuple(shape)} with zero elements")
            dims[holes[0]] = numel // known_numel
            if dims[holes[0]] * known_numel != numel:
                raise ShapeError(f"reshape: shape {show_shape(self.dims)} ({numel} elements) cannot be viewed as "
                                 f"{tuple(shape)}")
        elif known_numel != numel:
            raise ShapeError(f"reshape: shape {show_shape(self.dims)} ({numel} elements) cannot become "
                             f"{show_shape(dims)} ({known_numel} elements)")
        tracker = self.tracker.reshape(dims)
        if tracker is None:
            return self.contiguous().reshape(*dims)
        return self._view(tracker)

    view = reshape

    def permute(self, *dims) -> GraphTensor:
        dims = [normalize_dim(d, self.ndim) for d in _sizes(dims)]
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"permute: {tuple(dims)} is not a permutation of the {self.ndim} dims")
        return self._view(self.tracker.permute(dims))

    def transpose(self, dim0: int, dim1: int) -> GraphTensor:
        order = list(range(self.ndim))
        a, b = normalize_dim(dim0, self.ndim), normalize_dim(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(*order) if self.ndim else self

    @property
    def T(self) -> GraphTensor:
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self) -> GraphTensor:
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> GraphTensor:
        dim = normalize_dim(dim, self.ndim + 1)
        return self.reshape(*self.dims[:dim], 1, *self.dims[dim:])

    def squeeze(self, dim=None) -> GraphTensor:
        dims = range(self.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
        drop = {normalize_dim(d, self.ndim) for d in dims}
        return self.reshape(*[d for k, d in enumerate(self.dims) if not (k in drop and d == sym(1))])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> GraphTensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = normalize_dim(start_dim, self.ndim), normalize_dim(end_dim, self.ndim)
        return self.reshape(*self.dims[:s], -1, *self.dims[e + 1:]) if s <= e else self

    def flip(self, dims) -> GraphTensor:
        tracker = self.tracker
        for d in ([dims] if isinstance(dims, int) else dims):
            tracker = tracker.flip(normalize_dim(d, self.ndim))
        return self._view(tracker)

    def narrow(self, dim: int, start, length) -> GraphTensor:
        """torch.narrow: `length` elements from `start` (negative counts from the end) along `dim`."""
        dim = normalize_dim(dim, self.ndim)
        n = self.dims[dim]
        if isinstance(start, (int, np.integer)) and start < 0:
            if n.is_const and start < -n.value:
                raise ShapeError(f"narrow: start {start} is out of range for dim {dim} of size {n}")
            start = n + int(start)
        end = sym(start) + length
        if isinstance(length, (int, np.integer)) and length < 0 or (n - end).is_const and (n - end).value < 0:
            raise ShapeError(f"narrow: start {start} + length {length} exceeds dim {dim} of size {n}")
        return self._view(self.tracker.slice(dim, start, end))

    def unfold(self, dimension: int, size: int, step: int, dilation: int = 1) -> GraphTensor:
        """PyTorch unfold: windows of `size` every `step` along `dimension`, window dim appended last."""
        d = normalize_dim(dimension, self.ndim)
        if size < 1 or step < 1 or dilation < 1:
            raise ShapeError(f"unfold: size, step and dilation must be >= 1, got {size}, {step}, {dilation}")
        n = self.dims[d]
        if n.is_const and n.value < dilation * (size - 1) + 1:
            raise ShapeError(f"unfold: window of {size} (dilation {dilation}) does not fit dim {dimension} of size {n}")
        t = self._view(self.tracker.window(d, size, step, dilation))
        return t.permute(*[k for k in range(t.ndim) if k != d + 1], d + 1)  # the window axis last

    def pad(self, pad: Sequence[int], value: float = 0.0) -> GraphTensor:
        """torch.nn.functional.pad (constant mode): pairs (before, after) from the last dim backwards.

        Negative amounts crop. A non-zero `value` is added where the padding is.
        """
        if len(pad) % 2 or len(pad) // 2 > self.ndim:
            raise ShapeError(f"pad: expected pairs for at most {self.ndim} dims, got {tuple(pad)}")
        tracker = self.tracker
        for i in range(len(pad) // 2):
            dim = self.ndim - 1 - i
            before, after = pad[2 * i], pad[2 * i + 1]
            if isinstance(before, int) and isinstance(after, int):  # negative amounts crop
                tracker = tracker.slice(dim, max(-before, 0), tracker.shape[dim] - max(-after, 0))
                before, after = max(before, 0), max(after, 0)
            tracker = tracker.pad(dim, before, after)  # symbolic amounts must be >= 0
        out = self._view(tracker)
        if value:
            inside = self.graph.constant(1.0, self.dims).pad(pad)  # 1 where data is, 0 in the padding
            out = out + (1.0 - inside) * value
        return out

    def __getitem__(self, index) -> GraphTensor:
        """Basic indexing: ints, slices (any step > 0, negative bounds), None and Ellipsis."""
        index = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in index) > 1:
            raise ShapeError("an index can only have a single ellipsis")
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        if used > self.ndim:
            raise ShapeError(f"too many indices for a tensor of rank {self.ndim}: {index}")
        k = next((j for j, item in enumerate(index) if item is Ellipsis), None)  # (`in` would call a tensor's ==)
        if k is not None:
            index = index[:k] + (slice(None),) * (self.ndim - used) + index[k + 1:]
        tracker, dim, out_shape = self.tracker, 0, []
        for item in index:
            if item is None:
                out_shape.append(sym(1))
                continue
            n = tracker.shape[dim]
            if isinstance(item, slice):
                tracker = tracker.slice(dim, *_slice_bounds(item, n))
                out_shape.append(tracker.shape[dim])
            elif is_int(item):
                if n.is_const and not -n.value <= item < n.value:
                    raise ShapeError(f"index {item} is out of bounds for dim {dim} with size {n}")
                i = item if item >= 0 else n + item
                tracker = tracker.slice(dim, i, sym(i) + 1)
            else:
                raise UnsupportedError(f"unsupported index {item!r}: use ints, slices, None, ... "
                                       f"(or index_select/gather for tensor indices)")
            dim += 1
        out_shape += list(tracker.shape[dim:])
        return self._view(tracker).reshape(*out_shape)


def where(condition, input, other) -> GraphTensor:
    """torch.where: `input` where `condition` is non-zero, else `other` (numbers allowed for either).

    Composed as cond * input + (1 - cond) * other, exact for a 0/1 mask; a NaN or inf in the
    branch not taken still propagates, because selection is arithmetic on primitives.
    """
    anchor = next((t for t in (condition, input, other) if isinstance(t, GraphTensor)), None)
    if anchor is None:
        raise UnsupportedError("where: at least one argument must be a GraphTensor")
    cond = anchor._lift(condition).ne(0.0)
    input, other = anchor._lift(input), anchor._lift(other)
    return cond * input + (1.0 - cond) * other


_LOG2_E = 1.4426950408889634
_LN_2 = 0.6931471805599453


def _sizes(args) -> tuple:
    """Accept f(2, 3) and f((2, 3)) alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _slice_bounds(item: slice, n: Expr):
    """Python slice semantics (clamped, negative bounds from the end) for a possibly symbolic size."""
    step = 1 if item.step is None else item.step
    if not isinstance(step, int) or step <= 0:
        raise UnsupportedError(f"slice step must be a positive int (use flip to reverse), got {item.step!r}")

    def clamp(v, default):
        if v is None:
            return default
        v = sym(v)
        if v.is_const and v.value < 0:
            v = n + v.value
        return smin(smax(v, 0), n)

    start, stop = clamp(item.start, sym(0)), clamp(item.stop, n)
    return start, smax(stop, start), step


# -- attach the op library ---------------------------------------------------------------------
from .library import attach  # noqa: E402  (the library composes the methods defined above)

# torch.reshape(x, ...) style functions for the core methods, next to the library's
_CORE_FUNCTIONS = ("reshape", "permute", "transpose", "flatten", "squeeze", "unsqueeze", "flip", "narrow",
                   "broadcast_to", "pad", "matmul", "contiguous", "exp", "exp2", "log", "log2", "sin", "sqrt",
                   "reciprocal", "fmod", "lt", "gt", "le", "ge", "eq", "ne")
FUNCTIONS = {**attach(GraphTensor), "where": where, **{n: getattr(GraphTensor, n) for n in _CORE_FUNCTIONS}}


def _merge_adjacent(t: GraphTensor, axes: list[int]) -> tuple[GraphTensor, list[int]]:
    """`t` and the axes to reduce one at a time (highest first), after viewing each pair of adjacent
    reduced axes as one axis where the strides allow it (e.g. the batch and sequence axes of a
    weight gradient): one long reduction instead of nested short ones, which schedule better."""
    out = []
    for axis in axes:  # descending, so `out` holds the higher axes still to reduce
        if out and out[-1] == axis + 1:
            merged = t.tracker.reshape(t.dims[:axis] + (t.dims[axis] * t.dims[axis + 1],) + t.dims[axis + 2:])
            if merged is not None:  # axes axis and axis + 1 are one now: the ones above move down
                t = t._view(merged)
                out = [a - 1 for a in out[:-1]] + [axis]
                continue
        out.append(axis)
    return t, out
