"""Reverse-mode autodiff as a graph transformation: `grad(loss, params)` adds the backward graph.

The gradients are new nodes in the loss's own Graph, built from the same primitives, so the
reference interpreter and every compiler run training exactly as they run inference (mark the
gradients as outputs, or feed them to `Graph.update` for an optimizer step).

How it works:

1. Find the nodes that lie between a parameter and the loss (they need a gradient).
2. Walk the graph backwards from the loss. A node's gradient is the sum of what its consumers
   send it. A primitive turns its output's gradient into one per input with its rule, stored
   next to its definition (`Primitive.grad` in ops.py; less_than passes none, mod follows
   torch.fmod); Contiguous passes it through; Inputs and Constants stop it.
3. Graph edges are views (a ShapeTracker). A primitive's rule gives the gradient of the view
   it read; the view's own transpose carries it back to the source buffer. Each tracker
   records the view ops that made it (`ShapeTracker.history`), and each op has a transpose
   made of views and sums, never a one-hot: expand sums over the broadcast dims, slice pads
   (spreading out first when it has a step), pad slices (so masked positions get nothing),
   flip flips, permute permutes back, reshape reshapes back, and a window (unfold, the
   convolution's view) adds up one shifted pad per kernel position.

Deviations from torch.autograd.grad: a parameter the loss does not depend on gets a zeros
tensor (torch's allow_unused=True, materialize_grads=True) instead of an error; the result is
a list even for one parameter. Max ties split the gradient evenly per reduced axis, so a
multi-axis amax (or max_pool) with ties spreads it per axis, not evenly over all tied
positions as torch does; relu and maximum (a 2-element max) give 0.5 at x == 0, torch 0.
"""
from __future__ import annotations

from collections.abc import Sequence

from . import dtypes
from .errors import DTypeError, InputError, ShapeError, UnsupportedError
from .graph import Node, show_shape
from .shape import ShapeTracker, ViewStep
from .tensor import GraphTensor


def grad(loss: GraphTensor, params: GraphTensor | Sequence[GraphTensor]) -> list[GraphTensor]:
    """torch.autograd.grad(loss, params): d loss / d param for each param, as graph tensors.

    `loss` must have one element. Each param is a float tensor of the loss's graph that is not a
    view: an input (a weight) or any computed tensor. A param the loss does not depend on gets
    zeros. Symbolic dims work: the backward graph has the forward graph's dims.
    """
    params = [params] if isinstance(params, GraphTensor) else list(params)
    _check(loss, params)
    graph = loss.graph
    wanted = {p.node.id for p in params}
    needed = _downstream(graph.nodes[:loss.node.id + 1], wanted)
    grads: dict[int, GraphTensor] = {}
    if loss.node.id in needed:
        _accumulate(grads, loss.node, _through_view(graph.constant(1.0, loss.dims), loss.tracker, loss.node))
    for node in reversed(graph.nodes[:loss.node.id + 1]):  # grads built below are appended after
        g = grads.get(node.id)
        if g is None or node.op in ("input", "constant"):
            continue
        for (src, tracker), src_grad in zip(node.srcs, _rule(graph, node, g)):
            if src_grad is not None and src.id in needed:
                _accumulate(grads, src, _through_view(src_grad, tracker, src))
    return [_param_grad(p, grads.get(p.node.id)) for p in params]


def _check(loss, params) -> None:
    if not isinstance(loss, GraphTensor):
        raise UnsupportedError(f"grad: loss must be a GraphTensor, got {type(loss).__name__}")
    if not (loss.tracker.numel.is_const and loss.tracker.numel.value == 1):
        raise ShapeError(f"grad: loss must be a scalar (one element), got shape {show_shape(loss.dims)}")
    for k, p in enumerate(params):
        if not isinstance(p, GraphTensor):
            raise UnsupportedError(f"grad: params[{k}] must be a GraphTensor, got {type(p).__name__}")
        what = f"grad: params[{k}] ({p.node.name or p.node.op}, shape {show_shape(p.dims)})"
        if p.graph is not loss.graph:
            raise InputError(f"{what} belongs to another graph than the loss")
        if p.dtype not in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
            raise DTypeError(f"{what} has integer dtype {p.dtype}: only float tensors have gradients")
        if p.node.op == "constant":
            raise UnsupportedError(f"{what} is a constant: constants have no gradient")
        if not (p.tracker.is_contiguous() and p.tracker.numel == ShapeTracker.contiguous(p.node.shape).numel):
            raise UnsupportedError(f"{what} is a view of node %{p.node.id} {show_shape(p.node.shape)}: "
                                   f"pass the tensor the view was taken from")


def _downstream(nodes: list[Node], sources: set[int]) -> set[int]:
    """Ids of the nodes (in topological order) that read, directly or not, one of `sources`."""
    reached = set(sources)
    for node in nodes:
        if any(src.id in reached for src, _ in node.srcs):
            reached.add(node.id)
    return reached


def _rule(graph, node: Node, g: GraphTensor) -> list:
    """One gradient (or None) per source of `node`, shaped like the view that source is read through."""
    if node.op == "contiguous":
        return [g]
    inputs = [GraphTensor(graph, src, tracker) for src, tracker in node.srcs]
    out = GraphTensor(graph, node, ShapeTracker.contiguous(node.shape))
    if node.primitive.kind == "reduce":
        return node.primitive.grad(*inputs, out, g, axis=node.axis)
    return node.primitive.grad(*inputs, out, g)


def _accumulate(grads: dict, node: Node, g: GraphTensor) -> None:
    assert tuple(g.dims) == tuple(node.shape), (g.dims, node.shape)  # a broken rule, not a user error
    grads[node.id] = g if node.id not in grads else grads[node.id] + g


def _param_grad(p: GraphTensor, g: GraphTensor | None) -> GraphTensor:
    if g is None:  # the loss does not depend on p
        return p.graph.constant(0.0, p.dims)
    return g.reshape(*p.dims)  # p may be a reshape of its node (the same elements in order)


# -- views: send a gradient from a view back to the buffer it reads -----------------------------
def _through_view(g: GraphTensor, tracker: ShapeTracker, src: Node) -> GraphTensor:
    """The gradient for `src`'s buffer, given the gradient `g` of the view `tracker` of it."""
    if not tracker.history:
        if tracker != ShapeTracker.contiguous(src.shape):
            raise UnsupportedError(f"grad: node %{src.id} is read through a view with no recorded history "
                                   f"(built outside ShapeTracker's view ops); its gradient is unknown")
        return g
    if tracker.history[0].before != tuple(src.shape):
        raise UnsupportedError(f"grad: the view history of an edge from node %{src.id} does not start at its shape")
    for step in reversed(tracker.history):
        g = _TRANSPOSE[step.op](g, step)
    return g


def _unpermute(g: GraphTensor, step: ViewStep) -> GraphTensor:
    order = step.args[0]
    return g.permute(*sorted(range(len(order)), key=order.__getitem__))


def _unexpand(g: GraphTensor, step: ViewStep) -> GraphTensor:
    broadcast = [k for k, (old, new) in enumerate(zip(step.before, g.dims)) if old != new]
    return g.sum(broadcast, keepdim=True) if broadcast else g


def _unslice(g: GraphTensor, step: ViewStep) -> GraphTensor:
    dim, start, _stop, stride = step.args
    return _place(_spread(g, dim, stride), dim, start, step.before[dim])


def _unpad(g: GraphTensor, step: ViewStep) -> GraphTensor:
    dim, before, _after = step.args
    return g._view(g.tracker.slice(dim, before, before + step.before[dim]))


def _unwindow(g: GraphTensor, step: ViewStep) -> GraphTensor:
    """Windows overlap: each kernel position k sends its slice back shifted by k * dilation."""
    dim, size, stride, dilation = step.args
    g = _spread(g, dim, stride)  # once for every k
    total = None
    for k in range(size):
        part = g._view(g.tracker.slice(dim + 1, k, k + 1)).squeeze(dim + 1)
        part = _place(part, dim, k * dilation, step.before[dim])
        total = part if total is None else total + part
    return total


def _spread(g: GraphTensor, dim: int, stride: int) -> GraphTensor:
    """Insert stride - 1 zeros between the elements along `dim` (none after the last one)."""
    if stride == 1:
        return g
    dims, size = g.dims, g.dims[dim]
    g = g.unsqueeze(dim + 1)
    g = g._view(g.tracker.pad(dim + 1, 0, stride - 1))
    g = g.reshape(*dims[:dim], size * stride, *dims[dim + 1:])  # a Contiguous copy
    return g._view(g.tracker.slice(dim, 0, (size - 1) * stride + 1))


def _place(g: GraphTensor, dim: int, start, length) -> GraphTensor:
    """Zero-pad along `dim` so that g starts at `start` in a dim of `length`."""
    return g._view(g.tracker.pad(dim, start, length - start - g.dims[dim]))


_TRANSPOSE = {
    "permute": _unpermute,
    "expand": _unexpand,
    "slice": _unslice,
    "pad": _unpad,
    "flip": lambda g, step: g.flip(step.args[0]),
    "window": _unwindow,
    "reshape": lambda g, step: g.reshape(*step.before),
}
