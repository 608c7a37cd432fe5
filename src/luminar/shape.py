"""ShapeTracker: how a logical tensor reads a buffer, so that view ops move no data.

A tracker is one strided view plus a validity expression:

    element (i0, i1, ...) of the tensor  =  buffer[offset + i0*stride0 + i1*stride1 + ...]
                                            if valid(i0, i1, ...) else 0

Strides, offset and shape are symbolic integer expressions (`luminar.symbolic`). The index of
dimension k is the variable `_dk` (`index_var(k, dim)`), and `valid` is a 0/1 expression over
those variables; it is 1 for plain views and becomes a range test after `pad`. permute, expand,
slice, flip, pad and window all rewrite strides and substitute into `valid`; `reshape` does so
when the strides allow, and returns None otherwise (the tensor layer then inserts Contiguous).

Each tracker also remembers the view ops that made it (`history`, oldest first, starting from
the contiguous tracker of its buffer). Autograd transposes that list to send a gradient back
through the view; the history is not part of a tracker's identity (equality, hash, repr).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import NamedTuple

from .symbolic import Expr, Var, smax, sym


def index_var(k: int, dim: Expr) -> Expr:
    """The variable naming the index along dimension k of a tensor whose size there is `dim`."""
    dim = sym(dim)
    return Var(f"_d{k}", 0, max(dim.value - 1, 0) if dim.is_const else None)


def index_vars(shape) -> list[Expr]:
    return [index_var(k, d) for k, d in enumerate(shape)]


def row_major_strides(shape) -> tuple[Expr, ...]:
    strides, acc = [], sym(1)
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d
    return tuple(reversed(strides))


def numel(shape) -> Expr:
    """The number of elements of `shape` (symbolic where the dims are)."""
    return prod(shape, start=sym(1))


def flat_index(idx, shape) -> Expr:
    """The row-major position of index `idx` in a buffer of `shape`."""
    return sum((i * s for i, s in zip(idx, row_major_strides(shape))), sym(0))


def _splice(seq, k: int, *values) -> list:
    """`seq` as a list with element k replaced by `values` (one or more)."""
    return [*seq[:k], *values, *seq[k + 1:]]


class ViewStep(NamedTuple):
    """One view op in a tracker's history: `op` (a ShapeTracker method name) applied with `args`
    to a view of shape `before`."""
    op: str
    before: tuple
    args: tuple


@dataclass(frozen=True)
class ShapeTracker:
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    offset: Expr
    valid: Expr  # 0/1 over the index variables _d0.._dn
    history: tuple[ViewStep, ...] = field(default=(), compare=False, repr=False)

    @staticmethod
    def contiguous(shape) -> ShapeTracker:
        shape = tuple(sym(d) for d in shape)
        return ShapeTracker(shape, row_major_strides(shape), sym(0), sym(1))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Expr:
        return numel(self.shape)

    def is_contiguous(self) -> bool:
        """True when the view reads its buffer exactly in row-major order, with nothing masked."""
        live = [(d, s) for d, s in zip(self.shape, self.strides) if d != sym(1)]
        expected = row_major_strides([d for d, _ in live])
        return self.offset == sym(0) and self.valid == sym(1) and all(
            s == e for (_, s), e in zip(live, expected))

    def index_expr(self, idx=None) -> Expr:
        """The flat buffer position read at `idx` (default: the index variables)."""
        idx = index_vars(self.shape) if idx is None else [sym(i) for i in idx]
        return sum((i * s for i, s in zip(idx, self.strides)), self.offset)

    def valid_expr(self, idx) -> Expr:
        """Whether position `idx` reads the buffer (1) or is padding (0); `self.valid` is this at
        the index variables themselves."""
        return self.valid.substitute({f"_d{k}": sym(i) for k, i in enumerate(idx)})

    # -- view ops: each returns a new tracker ------------------------------------------------
    def _with(self, step: tuple, shape, strides, offset, valid: Expr) -> ShapeTracker:
        """The new tracker after view op `step` = (name, *args), which is appended to the history."""
        return ShapeTracker(tuple(shape), tuple(strides), offset, valid, self._record(step))

    def _record(self, step: tuple) -> tuple[ViewStep, ...]:
        return self.history + (ViewStep(step[0], self.shape, tuple(step[1:])),)

    def permute(self, order) -> ShapeTracker:
        shape = [self.shape[o] for o in order]
        new = index_vars(shape)
        valid = self.valid.substitute({f"_d{old}": new[pos] for pos, old in enumerate(order)})
        return self._with(("permute", tuple(order)), shape, [self.strides[o] for o in order], self.offset, valid)

    def expand(self, shape) -> ShapeTracker:
        """Broadcast size-1 dimensions to `shape` (same rank) with stride 0."""
        shape = [sym(d) for d in shape]
        grown = [k for k, (old, new) in enumerate(zip(self.shape, shape)) if old != new]
        strides = [sym(0) if k in grown else s for k, s in enumerate(self.strides)]
        valid = self._reindexed(shape, {k: sym(0) for k in grown})
        return self._with(("expand", tuple(shape)), shape, strides, self.offset, valid)

    def slice(self, dim: int, start, stop, step: int = 1) -> ShapeTracker:
        """Keep start, start+step, ... < stop along `dim` (bounds already normalized, step > 0)."""
        start, stop = sym(start), sym(stop)
        size = smax((stop - start + step - 1) // step, 0)
        shape = _splice(self.shape, dim, size)
        strides = _splice(self.strides, dim, self.strides[dim] * step)
        valid = self._reindexed(shape, {dim: start + index_var(dim, size) * step})
        return self._with(("slice", dim, start, stop, step), shape, strides, self.offset + start * self.strides[dim],
                          valid)

    def flip(self, dim: int) -> ShapeTracker:
        n = self.shape[dim]
        strides = _splice(self.strides, dim, -self.strides[dim])
        valid = self._reindexed(self.shape, {dim: n - 1 - index_var(dim, n)})
        return self._with(("flip", dim), self.shape, strides, self.offset + (n - 1) * self.strides[dim], valid)

    def pad(self, dim: int, before, after) -> ShapeTracker:
        """Add `before`/`after` zero positions along `dim` (both >= 0)."""
        before, after = sym(before), sym(after)
        n = self.shape[dim]
        shape = _splice(self.shape, dim, n + before + after)
        i = index_var(dim, shape[dim])
        inside = i.ge(before) & i.lt(before + n)
        valid = self._reindexed(shape, {dim: i - before}) & inside
        return self._with(("pad", dim, before, after), shape, self.strides, self.offset - before * self.strides[dim],
                          valid)

    def window(self, dim: int, size: int, stride: int = 1, dilation: int = 1) -> ShapeTracker:
        """Replace `dim` (length n) by two dims (out, size): element (o, k) reads o*stride + k*dilation.

        This is the sliding window of pooling and convolution; out = (n - dilation*(size-1) - 1)//stride + 1.
        """
        out = (self.shape[dim] - dilation * (size - 1) - 1) // stride + 1
        shape = _splice(self.shape, dim, out, sym(size))
        strides = _splice(self.strides, dim, self.strides[dim] * stride, self.strides[dim] * dilation)
        new = index_vars(shape)
        subst = {f"_d{k}": new[k if k < dim else k + 1] for k in range(self.ndim) if k != dim}
        subst[f"_d{dim}"] = new[dim] * stride + new[dim + 1] * dilation
        valid = self.valid.substitute(subst)
        return self._with(("window", dim, size, stride, dilation), shape, strides, self.offset, valid)

    def reshape(self, shape) -> ShapeTracker | None:
        """The same elements in row-major order under a new shape, or None if strides cannot express it."""
        shape = tuple(sym(d) for d in shape)
        if shape == self.shape:
            return self
        if self.is_contiguous() or self.numel == sym(0):
            return replace(ShapeTracker.contiguous(shape), history=self._record(("reshape", shape)))
        one = sym(1)
        old_live = [k for k, d in enumerate(self.shape) if d != one]
        new_live = [j for j, d in enumerate(shape) if d != one]
        groups = _match_groups([self.shape[k] for k in old_live], [shape[j] for j in new_live])
        if groups is None:
            return None
        strides: list[Expr] = [sym(0)] * len(shape)  # size-1 dims: any stride works, 0 is clearest
        new_idx = index_vars(shape)
        subst = {f"_d{k}": sym(0) for k, d in enumerate(self.shape) if d == one}
        for old_group, new_group in groups:
            old_dims = [old_live[g] for g in old_group]
            new_dims = [new_live[g] for g in new_group]
            for a, b in zip(old_dims, old_dims[1:]):  # merging needs each stride to step over the next dim
                if self.strides[a] != self.strides[b] * self.shape[b]:
                    return None
            acc = self.strides[old_dims[-1]]
            for j in reversed(new_dims):
                strides[j], acc = acc, acc * shape[j]
            # each old index in terms of the new ones, for the validity expression
            flat = flat_index([new_idx[j] for j in new_dims], [shape[j] for j in new_dims])
            old_sizes = [self.shape[k] for k in old_dims]
            for k, size, scale in zip(old_dims, old_sizes, row_major_strides(old_sizes)):
                subst[f"_d{k}"] = (flat // scale) % size
        return self._with(("reshape", shape), shape, strides, self.offset, self.valid.substitute(subst))

    def _reindexed(self, shape, changed: dict[int, Expr]) -> Expr:
        """`valid` over the new view's index vars: dims in `changed` get their expression, others
        fresh index vars (for a view of `shape`)."""
        return self.valid.substitute({f"_d{k}": changed.get(k, index_var(k, d)) for k, d in enumerate(shape)})


def _sample(e: Expr) -> int:
    """A number that orders symbolic sizes plausibly (variables ~ large); only guides group matching."""
    return e.evaluate({v: 1009 + 17 * i for i, v in enumerate(sorted(e.vars()))})


def _match_groups(old, new):
    """Split two shapes (without size-1 dims) into consecutive groups of equal element count.

    Returns [(old_positions, new_positions), ...] or None when the products cannot be matched.
    """
    groups, i, j = [], 0, 0
    while i < len(old) and j < len(new):
        og, ng = [i], [j]
        po, pn = old[i], new[j]
        i, j = i + 1, j + 1
        while po != pn:
            if _sample(po) < _sample(pn):
                if i >= len(old):
                    return None
                og.append(i)
                po, i = po * old[i], i + 1
            else:
                if j >= len(new):
                    return None
                ng.append(j)
                pn, j = pn * new[j], j + 1
        groups.append((og, ng))
    return groups if i == len(old) and j == len(new) else None
