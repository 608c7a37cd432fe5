"""torch.nn.functional's loss functions, composed from the op library.

Names, arguments, defaults and results follow PyTorch 2.13, including the legacy
``size_average`` / ``reduce`` arguments and the ``weight`` arguments torch added to mse_loss,
l1_loss and huber_loss. Everything is computed in numerically stable forms: cross entropy goes
through log_softmax (max subtracted, logsumexp), the logistic losses through logsigmoid.

Class targets are graph tensors of class ids, stored as int32 or as integral float32 (luminar
computes in float32, so there is no separate long dtype). Deviations, all forced by a static
graph that cannot inspect its input values:

- an out-of-range class id selects no class: it contributes 0 to the loss (and, without a
  weight, still counts in the mean's denominator); PyTorch raises an index error;
- cross_entropy decides between class ids and class probabilities by shape, as PyTorch does
  ("soft targets when input and target shapes are the same"), so float class ids are accepted;
- selection is a one-hot product, so a -inf log-probability at a class that is not the target
  still turns the loss into NaN (0 * -inf); mask with large finite values instead.
"""
from __future__ import annotations

import warnings

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..graph import show_shape
from ..symbolic import Expr, sym
from ..tensor import GraphTensor, broadcast_shapes
from .elementwise import absolute, logsigmoid, minimum
from .indexing import one_hot
from .reduce import log_softmax

_REDUCTIONS = ("none", "mean", "sum")


# -- arguments --------------------------------------------------------------------------------------
def _reduction(op: str, reduction, size_average=None, reduce=None, allowed=_REDUCTIONS) -> str:
    """The reduction name, from torch's legacy size_average/reduce pair when either is given."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "mean" if size_average and reduce else "sum" if reduce else "none"
    if reduction not in allowed:
        raise ValueDomainError(f"{op}: {reduction!r} is not a valid value for reduction "
                               f"(expected one of {', '.join(map(repr, allowed))})")
    return reduction


def _tensor(op: str, name: str, value, like: GraphTensor | None = None) -> GraphTensor:
    """`value` checked to be a GraphTensor (of `like`'s graph)."""
    if not isinstance(value, GraphTensor):
        raise UnsupportedError(f"{op}: {name} must be a GraphTensor (declare it with g.tensor), "
                               f"got {type(value).__name__}")
    if like is not None and value.graph is not like.graph:
        raise ShapeError(f"{op}: {name} belongs to a different graph than input")
    return value


def _pair(op: str, input, target) -> tuple[GraphTensor, GraphTensor]:
    """input and target of a pointwise loss: broadcastable, with torch's warning when they differ."""
    input, target = _tensor(op, "input", input), _tensor(op, "target", target, like=input)
    try:
        broadcast_shapes(input.dims, target.dims)
    except ShapeError:
        raise ShapeError(f"{op}: target shape {show_shape(target.dims)} cannot be broadcast to input shape "
                         f"{show_shape(input.dims)}") from None
    if tuple(input.dims) != tuple(target.dims):
        warnings.warn(f"{op}: using a target size {show_shape(target.dims)} that is different to the input size "
                      f"{show_shape(input.dims)}; broadcasting may give unintended results", stacklevel=3)
    return input, target


def _same_shape_weight(op: str, weight, input) -> GraphTensor:
    weight = _tensor(op, "weight", weight, like=input)
    if tuple(weight.dims) != tuple(input.dims):
        raise ShapeError(f"{op}: weight must have the input's shape {show_shape(input.dims)}, "
                         f"got {show_shape(weight.dims)}")
    return weight


def _apply_reduction(loss: GraphTensor, reduction: str) -> GraphTensor:
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def _count(graph, n: Expr) -> float | GraphTensor:
    """A (possibly symbolic) element count as a number to divide by."""
    return float(n.value) if n.is_const else graph.constant(n)


def _weighted(loss: GraphTensor, weight: GraphTensor, reduction: str) -> GraphTensor:
    """torch's weighted mse/l1: the mean divides by the sum of the weights."""
    loss = loss * weight
    if reduction == "mean":
        return loss.sum() / weight.sum()
    return _apply_reduction(loss, reduction)


# -- regression -------------------------------------------------------------------------------------
def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    """F.mse_loss: (input - target)^2, reduced; with `weight` (input's shape) the mean is sum(w l) / sum(w)."""
    reduction = _reduction("mse_loss", reduction, size_average, reduce)
    input, target = _pair("mse_loss", input, target)
    diff = input - target
    if weight is not None:
        return _weighted(diff * diff, _same_shape_weight("mse_loss", weight, input), reduction)
    return _apply_reduction(diff * diff, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    """F.l1_loss: |input - target|, reduced; with `weight` (input's shape) the mean is sum(w l) / sum(w)."""
    reduction = _reduction("l1_loss", reduction, size_average, reduce)
    input, target = _pair("l1_loss", input, target)
    error = absolute(input - target)
    if weight is not None:
        return _weighted(error, _same_shape_weight("l1_loss", weight, input), reduction)
    return _apply_reduction(error, reduction)


def _quadratic_then_linear(error: GraphTensor, knee: float) -> tuple[GraphTensor, GraphTensor]:
    """(q, error - q) with q = min(error, knee): the quadratic and the linear part of a Huber-type loss.

    Splitting by min() instead of selecting between two branches keeps inf errors inf (a select
    would compute 0 * inf = NaN in the branch not taken).
    """
    q = minimum(error, knee)
    return q, error - q


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0):
    """F.smooth_l1_loss: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; beta = 0 is l1_loss."""
    reduction = _reduction("smooth_l1_loss", reduction, size_average, reduce)
    if beta < 0:
        raise ValueDomainError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    input, target = _pair("smooth_l1_loss", input, target)
    error = absolute(input - target)
    if beta == 0:
        return _apply_reduction(error, reduction)
    q, linear = _quadratic_then_linear(error, beta)
    return _apply_reduction(q * q * (0.5 / beta) + linear, reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None):
    """F.huber_loss: 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta).

    With `weight` (input's shape) the weighted losses are reduced as usual (the mean divides by
    the element count, not by the weights' sum: torch's huber_loss differs from mse_loss here).
    """
    reduction = _reduction("huber_loss", reduction)
    if delta <= 0:
        raise ValueDomainError(f"huber_loss: delta must be > 0, got {delta}")
    input, target = _pair("huber_loss", input, target)
    q, linear = _quadratic_then_linear(absolute(input - target), delta)
    loss = q * q * 0.5 + linear * delta
    if weight is not None:
        loss = loss * _same_shape_weight("huber_loss", weight, input)
    return _apply_reduction(loss, reduction)


# -- classification ---------------------------------------------------------------------------------
def _class_dim(op: str, input) -> int:
    """PyTorch's layout: (C,) unbatched, or (N, C, d1, ...) with classes on dim 1."""
    if input.ndim == 0:
        raise ShapeError(f"{op}: input must have a class dimension: (C,), (N, C) or (N, C, d1, ...), got a 0-d tensor")
    return 0 if input.ndim == 1 else 1


def _classes_last(x: GraphTensor, class_dim: int) -> GraphTensor:
    return x.permute(*[k for k in range(x.ndim) if k != class_dim], class_dim)


def _class_weight(op: str, weight, input, class_dim: int) -> GraphTensor | None:
    if weight is None:
        return None
    weight = _tensor(op, "weight", weight, like=input)
    if tuple(weight.dims) != (input.dims[class_dim],):
        raise ShapeError(f"{op}: weight must have one entry per class, shape ({input.dims[class_dim]},), "
                         f"got {show_shape(weight.dims)}")
    return weight


def _check_class_target(op: str, input, target, class_dim: int):
    expected = input.dims[:class_dim] + input.dims[class_dim + 1:]
    if tuple(target.dims) != tuple(expected):
        raise ShapeError(f"{op}: target of class ids must have shape {show_shape(expected)} (input "
                         f"{show_shape(input.dims)} without its class dim {class_dim}), got {show_shape(target.dims)}")


def _nll(log_probs_last, target, weight, ignore_index: int, reduction: str):
    """NLL over class-last log-probabilities: (per-element loss reduced, per-element target weight)."""
    hot = one_hot(target, log_probs_last.dims[-1])  # (..., C): 1.0 at each target class
    kept = target.ne(float(ignore_index))
    target_weight = kept if weight is None else (hot * weight).sum(-1) * kept
    loss = -((hot * log_probs_last).sum(-1) * target_weight)
    if reduction == "mean":  # torch: normalized by the total weight of the targets not ignored
        return loss.sum() / target_weight.sum(), target_weight
    return _apply_reduction(loss, reduction), target_weight


def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean"):
    """F.nll_loss: -weight[t] * input[..., t, ...] per element; targets equal to ignore_index count 0.

    input (C,), (N, C) or (N, C, d1, ...) holds log-probabilities; target has input's shape
    without C. The mean divides by the summed weights of the targets not ignored (NaN when all
    are ignored, as in PyTorch).
    """
    reduction = _reduction("nll_loss", reduction, size_average, reduce)
    input = _tensor("nll_loss", "input", input)
    target = _tensor("nll_loss", "target", target, like=input)
    class_dim = _class_dim("nll_loss", input)
    _check_class_target("nll_loss", input, target, class_dim)
    weight = _class_weight("nll_loss", weight, input, class_dim)
    return _nll(_classes_last(input, class_dim), target, weight, ignore_index, reduction)[0]


def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """F.cross_entropy: log_softmax over the class dim, then NLL against class ids or class probabilities.

    input is (C,), (N, C) or (N, C, d1, ...). A target of input's shape holds class
    probabilities (mean: divided by the number of elements without C; ignore_index unsupported,
    as in PyTorch); a target of input's shape without C holds class ids (mean: divided by the
    summed weights of the targets not ignored). label_smoothing mixes the target with the
    uniform distribution over the C classes, as PyTorch does.
    """
    reduction = _reduction("cross_entropy", reduction, size_average, reduce)
    input = _tensor("cross_entropy", "input", input)
    target = _tensor("cross_entropy", "target", target, like=input)
    class_dim = _class_dim("cross_entropy", input)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueDomainError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    weight = _class_weight("cross_entropy", weight, input, class_dim)
    log_probs = _classes_last(log_softmax(input, class_dim), class_dim)  # (..., C)
    if tuple(target.dims) == tuple(input.dims):
        if ignore_index >= 0:
            raise UnsupportedError(f"cross_entropy: ignore_index ({ignore_index}) is not supported for class "
                                   f"probability targets (target shape equals input shape {show_shape(input.dims)})")
        return _soft_cross_entropy(log_probs, _classes_last(target, class_dim), weight, reduction, label_smoothing)
    _check_class_target("cross_entropy", input, target, class_dim)
    loss, target_weight = _nll(log_probs, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return loss
    # PyTorch: (1 - eps) * nll + eps / C * (the loss against the uniform distribution, normalized like nll)
    uniform = -(log_probs if weight is None else log_probs * weight).sum(-1) * target.ne(float(ignore_index))
    if reduction == "mean":
        uniform = uniform.sum() / target_weight.sum()
    else:
        uniform = _apply_reduction(uniform, reduction)
    classes = _count(input.graph, input.dims[class_dim])
    return loss * (1.0 - label_smoothing) + uniform * (label_smoothing / classes)


def _soft_cross_entropy(log_probs, probs, weight, reduction: str, label_smoothing: float):
    """Cross entropy against class probabilities, both with classes last."""
    classes = log_probs.dims[-1]
    if label_smoothing:
        probs = probs * (1.0 - label_smoothing) + label_smoothing / _count(log_probs.graph, classes)
    terms = log_probs * probs if weight is None else log_probs * probs * weight
    loss = -terms.sum(-1)
    if reduction == "mean":  # torch: divided by the number of positions, numel / C
        positions = sym(1)
        for d in log_probs.dims[:-1]:
            positions = positions * d
        return loss.sum() / _count(log_probs.graph, positions)
    return _apply_reduction(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction: str = "mean", pos_weight=None):
    """F.binary_cross_entropy_with_logits: -[pos_weight t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))] * weight.

    Computed as PyTorch does, (1 - t) x - (1 + (pos_weight - 1) t) logsigmoid(x), finite for any x.
    target must have input's shape; weight and pos_weight broadcast against it (pos_weight holds
    one weight per class along the last dim).
    """
    op = "binary_cross_entropy_with_logits"
    reduction = _reduction(op, reduction, size_average, reduce)
    input = _tensor(op, "input", input)
    target = _tensor(op, "target", target, like=input)
    if tuple(target.dims) != tuple(input.dims):
        raise ShapeError(f"{op}: target size {show_shape(target.dims)} must be the same as input size "
                         f"{show_shape(input.dims)}")
    log_sigmoid = logsigmoid(input)
    if pos_weight is not None:
        pos_weight = _broadcastable(op, "pos_weight", pos_weight, input)
        log_sigmoid = log_sigmoid * ((pos_weight - 1.0) * target + 1.0)
    loss = (1.0 - target) * input - log_sigmoid
    if weight is not None:
        loss = loss * _broadcastable(op, "weight", weight, input)
    return _apply_reduction(loss, reduction)


def _broadcastable(op: str, name: str, value, input) -> GraphTensor:
    value = _tensor(op, name, value, like=input)
    try:
        if broadcast_shapes(value.dims, input.dims) == tuple(input.dims):
            return value
    except ShapeError:
        pass
    raise ShapeError(f"{op}: {name} of shape {show_shape(value.dims)} does not broadcast to the input shape "
                     f"{show_shape(input.dims)}")


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False):
    """F.kl_div: target * (log(target) - input) pointwise, with input given as log-probabilities.

    Pointwise as PyTorch: xlogy(t, t) - t * input (0 where t = 0), or exp(t) * (t - input) when
    log_target. reduction "batchmean" sums and divides by input.size(0) (the KL divergence per
    batch element); "mean" divides by the element count, as PyTorch does.
    """
    reduction = _reduction("kl_div", reduction, size_average, reduce, allowed=(*_REDUCTIONS, "batchmean"))
    input, target = _pair("kl_div", input, target)
    if log_target:
        pointwise = target.exp() * (target - input)
    else:
        # xlogy(t, t): log(t + [t == 0]) is log(1) = 0 where t = 0, so 0 * log 0 never forms a NaN
        pointwise = target * (target + target.eq(0.0)).log() - target * input
    if reduction != "batchmean":
        return _apply_reduction(pointwise, reduction)
    total = pointwise.sum()
    return total if input.ndim == 0 else total / _count(input.graph, input.dims[0])


FUNCTIONS = {
    "mse_loss": mse_loss, "l1_loss": l1_loss, "smooth_l1_loss": smooth_l1_loss, "huber_loss": huber_loss,
    "cross_entropy": cross_entropy, "nll_loss": nll_loss,
    "binary_cross_entropy_with_logits": binary_cross_entropy_with_logits, "kl_div": kl_div,
}
