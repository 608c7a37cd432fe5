"""Gradient clipping by global norm, as graph ops (torch.nn.utils.clip_grad_norm_)."""
from __future__ import annotations

import math

from ..errors import InputError, ValueDomainError
from ..library.elementwise import maximum, minimum


def clip_grad_norm(grads, max_norm: float, norm_type: float = 2.0):
    """torch.nn.utils.clip_grad_norm_ on graph tensors: returns (clipped grads, total_norm).

    total_norm is the `norm_type`-norm of all gradients together (as if concatenated); every
    gradient is scaled by min(1, max_norm / (total_norm + 1e-6)), torch's formula with its 1e-6
    epsilon. `norm_type` is a positive number or inf.

    Deviations: the result is new tensors rather than an in-place update, and
    `error_if_nonfinite` has no equivalent (a graph cannot raise): a non-finite norm propagates.
    A negative max_norm is rejected (torch accepts it and flips the gradients' signs).
    """
    grads = list(grads)
    if not grads:
        raise InputError("clip_grad_norm: no gradients given")
    graph = getattr(grads[0], "graph", None)
    for k, g in enumerate(grads):
        if getattr(g, "graph", None) is not graph or graph is None:
            raise InputError(f"clip_grad_norm: gradient {k} must be a GraphTensor of the same graph as gradient 0, "
                             f"got {g!r}")
    max_norm = _check_positive("max_norm", max_norm, allow_zero=True)
    norm_type = _check_positive("norm_type", norm_type, allow_inf=True)
    total_norm = _total_norm(grads, norm_type)
    # torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1
    scale = minimum((total_norm + 1e-6).reciprocal() * max_norm, 1.0)
    return [g * scale for g in grads], total_norm


def _total_norm(grads, norm_type: float):
    """The norm of all gradients' elements together, as a 0-d tensor."""
    if norm_type == math.inf:
        total = grads[0].abs().amax()
        for g in grads[1:]:
            total = maximum(total, g.abs().amax())
        return total
    if norm_type == 2.0:
        return _sum_all([(g * g).sum() for g in grads]).sqrt()
    if norm_type == 1.0:
        return _sum_all([g.abs().sum() for g in grads])
    return _sum_all([g.abs().pow(norm_type).sum() for g in grads]).pow(1.0 / norm_type)


def _sum_all(scalars):
    """The sum of a list of 0-d tensors (Python's sum would start from the int 0)."""
    total = scalars[0]
    for s in scalars[1:]:
        total = total + s
    return total


def _check_positive(what: str, value, allow_zero: bool = False, allow_inf: bool = False) -> float:
    ok_type = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok_type or math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueDomainError(f"clip_grad_norm: {what} must be a finite number {bound}"
                               f"{' or inf' if allow_inf else ''}, got {value!r}")
    return float(value)
