"""Reductions: mean, var/std, min/max with indices, argmax, logsumexp, softmax, cumsum, norms.

All are compositions of `sum_reduce` / `max_reduce` and elementwise primitives, with PyTorch's
names, arguments and defaults (negative dims, tuple dims, keepdim, dim=None for everything, 0-d
inputs returned as they are). Counts such as a mean's divisor are symbolic expressions, so
every op works on symbolic dims.

Deviations from PyTorch, all because luminar computes in float32:
- indices (argmax, argmin, max(dim).indices) and 0/1 results (all, any) and counts
  (count_nonzero) are float32 arrays; indices are exact up to 2**24.
- NaN is not treated as the maximum by argmax/max(dim), and all/any/count_nonzero count NaN
  as zero: luminar's comparisons with NaN follow from less_than, which is false for NaN.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..shape import index_var, numel
from ..symbolic import Expr, smax, sym
from ..tensor import GraphTensor, normalize_dim

_MOST_NEGATIVE = -3.0e38  # stands in for -inf, which constants cannot hold


class MaxResult(NamedTuple):
    """What x.max(dim) returns, like torch.return_types.max."""
    values: GraphTensor
    indices: GraphTensor


class MinResult(NamedTuple):
    """What x.min(dim) returns, like torch.return_types.min."""
    values: GraphTensor
    indices: GraphTensor


# -- helpers ---------------------------------------------------------------------------------
def _axes(x: GraphTensor, dim, op: str) -> tuple[int, ...]:
    """`dim` (an int, a sequence, or None / () for all dims) as sorted axes; () for a 0-d tensor."""
    dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    if dim is None or not dims:
        dims = range(x.ndim)
    axes = [normalize_dim(d, x.ndim, f"{op}: dim") for d in dims]  # errors read "mean: dim 3 is out of range..."
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{op}: a dim appears more than once in {dim!r}")
    return () if x.ndim == 0 else tuple(sorted(axes))


def _axis(x: GraphTensor, dim, op: str) -> int:
    """A single dim, required (PyTorch's softmax/cumsum/argmax-with-dim take exactly one)."""
    if dim is None:
        raise ShapeError(f"{op}: dim is required (PyTorch deprecated the implicit choice), e.g. {op}(dim=-1)")
    if isinstance(dim, (tuple, list)):
        raise ShapeError(f"{op}: dim must be a single int, got {dim!r}")
    return normalize_dim(dim, x.ndim, f"{op}: dim")


def _number(x: GraphTensor, n) -> GraphTensor:
    """A 0-d constant holding the integer `n`, a Python number or a symbolic expression."""
    if isinstance(n, Expr):
        return x.graph.constant(float(n.value) if n.is_const else n)
    return x.graph.constant(float(n))


def _nonempty(x: GraphTensor, axes, op: str) -> None:
    """PyTorch refuses max-like reductions over an empty dim (there is no identity to return)."""
    for a in axes:
        if x.dims[a] == sym(0):
            raise ShapeError(f"{op}: expected reduction dim {a} to have non-zero size, shape is {x.shape}")


def _extreme(x: GraphTensor, dim, keepdim: bool, op: str):
    """(max values, index of the first max) along one dim."""
    axis = _axis(x, dim, op)
    if x.ndim == 0:
        return x, x.graph.constant(0.0)
    _nonempty(x, [axis], op)
    n = x.dims[axis]
    m = x.amax(axis, keepdim=True)
    # Score n - i at the maxima and 0 elsewhere: its max picks the smallest i among tied maxima.
    countdown = x.graph.constant(n - index_var(0, n), (n,))
    countdown = countdown.reshape(*[n if k == axis else 1 for k in range(x.ndim)])
    indices = _number(x, n) - (x.eq(m) * countdown).amax(axis, keepdim=keepdim)
    return (m if keepdim else m.squeeze(axis)), indices


# -- means and spreads -----------------------------------------------------------------------
def mean(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.mean: the sum divided by the (possibly symbolic) number of reduced elements."""
    axes = _axes(x, dim, "mean")
    return x.sum(axes, keepdim) / _number(x, numel(x.dims[a] for a in axes))  # (symbolic where the dims are)


def _variance(x: GraphTensor, dim, unbiased, keepdim: bool, correction, op: str):
    """(var, mean) for var/std/var_mean/std_mean; `op` names the caller in errors."""
    if isinstance(dim, bool):  # torch's legacy x.var(unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise ValueDomainError(f"{op}: pass unbiased or correction, not both (got {unbiased!r} and {correction!r})")
    c = correction if correction is not None else int(unbiased is not False)
    axes = _axes(x, dim, op)
    m = mean(x, axes, keepdim=True)
    n = numel(x.dims[a] for a in axes)  # how many elements each result combines
    if n.is_const:
        dof = _number(x, max(n.value - c, 0))
    elif float(c).is_integer():
        dof = _number(x, smax(n - int(c), 0))
    else:  # a fractional correction with a symbolic count: not clamped at 0
        dof = _number(x, n) - c
    deviation = x - m
    return (deviation * deviation).sum(axes, keepdim) / dof, (m if keepdim else m.squeeze(axes))


def var(x: GraphTensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> GraphTensor:
    """torch.var: sum of squared deviations / max(N - correction, 0); correction 1 by default.

    `unbiased=False` means correction 0, as in PyTorch; x.var(False) is accepted too. With a
    fractional correction and a symbolic N the divisor is not clamped at 0.
    """
    return _variance(x, dim, unbiased, keepdim, correction, "var")[0]


def std(x: GraphTensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> GraphTensor:
    """torch.std: the square root of var (same arguments)."""
    return _variance(x, dim, unbiased, keepdim, correction, "std")[0].sqrt()


def var_mean(x: GraphTensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction=None) -> tuple[GraphTensor, GraphTensor]:
    """torch.var_mean: (var, mean), sharing the mean."""
    return _variance(x, dim, unbiased, keepdim, correction, "var_mean")


def std_mean(x: GraphTensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction=None) -> tuple[GraphTensor, GraphTensor]:
    """torch.std_mean: (std, mean), sharing the mean."""
    v, m = _variance(x, dim, unbiased, keepdim, correction, "std_mean")
    return v.sqrt(), m


# -- extremes --------------------------------------------------------------------------------
def amin(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.amin: the minimum over dim(s), as -amax(-x)."""
    axes = _axes(x, dim, "amin")
    _nonempty(x, axes, "amin")
    return -((-x).amax(axes, keepdim))


def max_(x: GraphTensor, dim=None, keepdim: bool = False):
    """torch.max, all three forms.

    x.max() -> the maximum (0-d); x.max(dim, keepdim) -> MaxResult(values, indices) with the
    first index of the maximum; x.max(other_tensor) -> the elementwise maximum (broadcast).
    """
    if isinstance(dim, GraphTensor):
        return x.maximum(dim)
    if dim is None:
        if keepdim:
            raise ShapeError("max: keepdim=True needs a dim")
        _nonempty(x, range(x.ndim), "max")
        return x.amax()
    return MaxResult(*_extreme(x, dim, keepdim, "max"))


def min_(x: GraphTensor, dim=None, keepdim: bool = False):
    """torch.min, all three forms (see max): min(), min(dim) -> MinResult, min(other)."""
    if isinstance(dim, GraphTensor):
        return -(-x).maximum(-dim)
    if dim is None:
        if keepdim:
            raise ShapeError("min: keepdim=True needs a dim")
        return amin(x)
    values, indices = _extreme(-x, dim, keepdim, "min")
    return MinResult(-values, indices)


def argmax(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.argmax: index of the first maximum (float32); dim=None searches the flattened tensor."""
    if dim is None:
        index = _extreme(x.reshape(-1), 0, False, "argmax")[1]
        return index.reshape(*[1] * x.ndim) if keepdim else index
    return _extreme(x, dim, keepdim, "argmax")[1]


def argmin(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.argmin: index of the first minimum (float32); dim=None searches the flattened tensor."""
    return argmax(-x, dim, keepdim)


# -- exponential families --------------------------------------------------------------------
def logsumexp(x: GraphTensor, dim, keepdim: bool = False) -> GraphTensor:
    """torch.logsumexp, stable: log(sum(exp(x - m))) + m with m the max (clamped finite so a
    slice that is all -inf gives -inf, as in PyTorch, instead of NaN)."""
    axes = _axes(x, dim, "logsumexp")
    m = x.amax(axes, keepdim=True).maximum(_MOST_NEGATIVE)
    out = (x - m).exp().sum(axes, keepdim=True).log() + m
    return out if keepdim else out.squeeze(axes)


def softmax(x: GraphTensor, dim=None) -> GraphTensor:
    """torch.softmax(x, dim), stable (the max is subtracted first). dim is required."""
    axis = _axis(x, dim, "softmax")
    e = (x - x.amax(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)


def log_softmax(x: GraphTensor, dim=None) -> GraphTensor:
    """torch.log_softmax(x, dim), stable: (x - m) - log(sum(exp(x - m))). dim is required."""
    axis = _axis(x, dim, "log_softmax")
    shifted = x - x.amax(axis, keepdim=True)
    return shifted - shifted.exp().sum(axis, keepdim=True).log()


# -- scans -----------------------------------------------------------------------------------
def cumsum(x: GraphTensor, dim=None) -> GraphTensor:
    """torch.cumsum: out[i] = x[0] + ... + x[i] along dim.

    A known length n pads n-1 zeros in front and sums every window of n (views only, exact for
    infinities); a symbolic length multiplies by a lower-triangular 0/1 constant and sums.
    Both do O(n^2) work before the compiler rewrites them.
    """
    axis = _axis(x, dim, "cumsum")
    if x.ndim == 0:
        return x
    t = x.transpose(axis, -1)
    n = t.dims[-1]
    if n.is_const:
        if n.value == 0:
            return x
        out = t.pad((n.value - 1, 0)).unfold(-1, n.value, 1).sum(-1)
    else:
        i, j = index_var(0, n), index_var(1, n)
        lower = x.graph.constant(j.le(i), (n, n))  # lower[i, j] = 1 where j <= i
        out = (t.unsqueeze(-2) * lower).sum(-1)
    return out.transpose(axis, -1)


# -- logical reductions and norms ------------------------------------------------------------
def all_(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.all as 0/1 floats: 1 where no element is zero (an empty slice gives 1)."""
    return x.eq(0.0).sum(_axes(x, dim, "all"), keepdim).eq(0.0)


def any_(x: GraphTensor, dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.any as 0/1 floats: 1 where some element is non-zero (an empty slice gives 0)."""
    return x.ne(0.0).sum(_axes(x, dim, "any"), keepdim).gt(0.0)


def count_nonzero(x: GraphTensor, dim=None) -> GraphTensor:
    """torch.count_nonzero (as float32, exact up to 2**24)."""
    return x.ne(0.0).sum(_axes(x, dim, "count_nonzero"))


def norm(x: GraphTensor, p="fro", dim=None, keepdim: bool = False) -> GraphTensor:
    """torch.norm (vector norms): p = 'fro' or 2, 1, inf, -inf, 0 (count), or any other number
    as (sum |x|^p)^(1/p) through exp2/log2. The nuclear norm is not supported."""
    axes = _axes(x, dim, "norm")
    if p == "fro" or p == 2:
        return (x * x).sum(axes, keepdim).sqrt()
    if isinstance(p, str) or not isinstance(p, (int, float, np.number)) or isinstance(p, bool):
        raise UnsupportedError(f"norm: p must be 'fro' or a number, got {p!r}")
    if p == 1:
        return x.abs().sum(axes, keepdim)
    if p == math.inf:
        return x.abs().amax(axes, keepdim)
    if p == -math.inf:
        return amin(x.abs(), axes, keepdim)
    if p == 0:
        return x.ne(0.0).sum(axes, keepdim)
    powered = (x.abs().log2() * float(p)).exp2()  # |x|^p; |x| = 0 gives log2 = -inf, so 0 for p > 0
    return (powered.sum(axes, keepdim).log2() * (1.0 / p)).exp2()


METHODS = {
    "mean": mean, "var": var, "std": std, "var_mean": var_mean, "std_mean": std_mean,
    "amin": amin, "max": max_, "min": min_, "argmax": argmax, "argmin": argmin,
    "logsumexp": logsumexp, "softmax": softmax, "log_softmax": log_softmax, "cumsum": cumsum,
    "all": all_, "any": any_, "count_nonzero": count_nonzero, "norm": norm,
}

# sum and amax are GraphTensor's own methods; they become top-level functions here
# (torch.sum(input, dim, keepdim)), as the unbound methods themselves.
FUNCTIONS = {"sum": GraphTensor.sum, "amax": GraphTensor.amax}
