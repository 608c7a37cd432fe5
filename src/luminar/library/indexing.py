"""Creation, masking, indexing, joining and splitting ops, composed from primitives.

Nothing here reads data at build time, so everything that in PyTorch is an indexed load is a
comparison against an index instead (DESIGN.md §3):

- ``arange`` is a symbolic Constant over the index variable ``_d0``; masks (``tril``, ``eye``)
  compare two such constants with ``less_than``.
- ``gather`` / ``index_select`` / ``embedding`` build a one-hot of the indices against an
  arange and multiply-sum it with the table; the compiler turns that back into a load.
- ``cat`` pads each input with zeros to the full length at its offset and adds them up, so it
  works with symbolic sizes along the joined dim; ``split`` / ``chunk`` are slicing views.

Deviations from PyTorch, all consequences of computing in float32 with primitives only:

- results are float32 (``arange(5)`` and ``one_hot`` are int64 in PyTorch);
- index tensors are read as numbers (declare them int32, or float32 holding integers); an
  index that is out of range (including a negative one) matches no class and yields zeros
  where PyTorch raises, because a one-hot cannot raise at run time;
- masking is arithmetic (``x * mask``), so an inf or NaN in a masked-out position still
  propagates (PyTorch's ``tril`` and ``masked_fill`` drop it);
- ``masked_fill`` values must be finite: use a large finite value such as ``-1e30`` where
  PyTorch code uses ``-inf`` (softmax gives the same result).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..graph import Graph, as_shape, parse_dim, show_shape
from ..shape import index_var
from ..symbolic import Expr, smax, sym
from ..tensor import GraphTensor, _sizes, is_int, normalize_dim


def _as_dim(v):
    """An int, dim name or Expr as an Expr; other values (floats) pass through unchanged."""
    return parse_dim(v) if isinstance(v, str) else sym(int(v)) if is_int(v) else v


def _known(d: Expr, op: str, what: str) -> int:
    """The int value of a dim this op needs to know at build time."""
    if not d.is_const:
        raise UnsupportedError(f"{op}: needs a known size for {what}, got the symbolic size {d}")
    return d.value


def _move_dim(t: GraphTensor, src: int, dst: int) -> GraphTensor:
    """torch.movedim for one dim (a permute view)."""
    src, dst = normalize_dim(src, t.ndim), normalize_dim(dst, t.ndim)
    order = [k for k in range(t.ndim) if k != src]
    order.insert(dst, src)
    return t.permute(*order)


# -- creation (Graph methods) ------------------------------------------------------------------
def arange(graph: Graph, start, end=None, step=1) -> GraphTensor:
    """torch.arange(start, end, step) as float32 values; `end` (or the 1-argument form) may be a
    symbolic dim such as "s" or ``x.shape[0]``. Integer arguments give the symbolic Constant
    ``start + step * _d0``; float ones scale the integer arange."""
    if end is None:
        start, end = 0, start
    start, end = _as_dim(start), _as_dim(end)
    for name, v in (("start", start), ("end", end), ("step", step)):
        if not isinstance(v, (Expr, float, np.floating)) and not is_int(v):
            raise ValueDomainError(f"arange: {name} must be a number or a dim, got {v!r}")
    if step == 0:
        raise ValueDomainError("arange: step must be non-zero, got 0")
    if not (isinstance(start, Expr) and isinstance(end, Expr) and is_int(step)):
        return _float_arange(graph, start, end, step)
    span = end - start if step > 0 else start - end
    if span.is_const and span.value < 0:
        raise ValueDomainError(f"arange: end {end} is not reachable from start {start} with step {step}")
    n = smax((span + abs(step) - 1) // abs(step), 0)
    return graph.constant(start + step * index_var(0, n), (n,))


def _float_arange(graph: Graph, start, end, step) -> GraphTensor:
    if any(isinstance(v, Expr) and not v.is_const for v in (start, end)):
        raise UnsupportedError(f"arange: a symbolic bound needs integer start and step, got start={start}, step={step}")
    start, end, step = (float(v.value if isinstance(v, Expr) else v) for v in (start, end, step))
    if not all(map(math.isfinite, (start, end, step))):
        raise ValueDomainError(f"arange: bounds must be finite, got start={start}, end={end}, step={step}")
    if (end - start) * step < 0:
        raise ValueDomainError(f"arange: end {end} is not reachable from start {start} with step {step}")
    return arange(graph, math.ceil((end - start) / step)) * step + start


def zeros(graph: Graph, *size) -> GraphTensor:
    """torch.zeros(*size): accepts zeros(2, 3) and zeros((2, "s"))."""
    return graph.constant(0.0, _sizes(size))


def ones(graph: Graph, *size) -> GraphTensor:
    """torch.ones(*size)."""
    return graph.constant(1.0, _sizes(size))


def full(graph: Graph, size, fill_value) -> GraphTensor:
    """torch.full(size, fill_value); the value must be finite."""
    return graph.constant(fill_value, as_shape(size))


def eye(graph: Graph, n, m=None) -> GraphTensor:
    """torch.eye(n, m): ones on the diagonal, from comparing a row and a column arange."""
    m = n if m is None else m
    return arange(graph, n).unsqueeze(-1).eq(arange(graph, m))


def zeros_like(input: GraphTensor) -> GraphTensor:
    """torch.zeros_like(input)."""
    return input.graph.constant(0.0, input.dims)


def ones_like(input: GraphTensor) -> GraphTensor:
    """torch.ones_like(input)."""
    return input.graph.constant(1.0, input.dims)


def full_like(input: GraphTensor, fill_value) -> GraphTensor:
    """torch.full_like(input, fill_value)."""
    return input.graph.constant(fill_value, input.dims)


# -- masks -------------------------------------------------------------------------------------
def _below_diagonal(x: GraphTensor, op: str, offset: int) -> GraphTensor:
    """1.0 where column j < row i + offset over x's last two dims (shape (rows, cols))."""
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected a tensor with at least 2 dims, got shape {show_shape(x.dims)}")
    if not is_int(offset):
        raise ValueDomainError(f"{op}: diagonal must be an int, got {offset!r}")
    rows = arange(x.graph, x.dims[-2]).unsqueeze(-1)
    return arange(x.graph, x.dims[-1]).lt(rows + offset)


def tril(x: GraphTensor, diagonal: int = 0) -> GraphTensor:
    """torch.tril: keep elements with column - row <= diagonal, zero the rest (x * mask)."""
    return x * _below_diagonal(x, "tril", diagonal + 1)


def triu(x: GraphTensor, diagonal: int = 0) -> GraphTensor:
    """torch.triu: keep elements with column - row >= diagonal, zero the rest (x * mask)."""
    return x * (1.0 - _below_diagonal(x, "triu", diagonal))


def masked_fill(x: GraphTensor, mask, value) -> GraphTensor:
    """torch.Tensor.masked_fill: `value` where `mask` is non-zero (broadcasting both ways).

    `value` is a finite number or a 0-d tensor; PyTorch's -inf is not a valid constant here, use
    -1e30. Composed as x * (1 - m) + value * m with m in {0, 1}, which is exact.
    """
    if isinstance(value, GraphTensor):
        if value.ndim:
            raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape {show_shape(value.dims)}")
    elif isinstance(value, (int, float, np.number)) and not math.isfinite(float(value)):
        raise ValueDomainError(f"masked_fill: value {value!r} is not finite; luminar constants must be finite, "
                               f"use a large finite value such as -1e30 instead of -inf")
    m = x._lift(mask).ne(0.0)
    return x * (1.0 - m) + m * value


# -- one-hot based indexing --------------------------------------------------------------------
def one_hot(tensor: GraphTensor, num_classes=-1) -> GraphTensor:
    """torch.nn.functional.one_hot: shape (*tensor.shape, num_classes), 1.0 at each index.

    The indices are numbers (int32 or integral float32 inputs). Out-of-range indices give an
    all-zero row (PyTorch raises). num_classes=-1 (infer from the data) is unsupported: a graph
    cannot depend on its input values; pass the number of classes.
    """
    if is_int(num_classes) and num_classes == -1:
        raise UnsupportedError("one_hot: num_classes=-1 would depend on the index values; pass num_classes explicitly")
    if is_int(num_classes) and num_classes < 0:
        raise ShapeError(f"one_hot: num_classes must be >= 0, got {num_classes}")
    return tensor.unsqueeze(-1).eq(arange(tensor.graph, num_classes))


def gather(x: GraphTensor, dim: int, index: GraphTensor) -> GraphTensor:
    """torch.gather: out[..., i, ...] = x[..., index[..., i, ...], ...] along `dim`.

    `index` has x's rank and no larger sizes than x on the other dims. Composed as the one-hot
    of index (along a new last axis of size x.shape[dim]) times x, summed over that axis.
    """
    if not isinstance(index, GraphTensor):
        raise UnsupportedError(f"gather: index must be a GraphTensor (a graph input), got {type(index).__name__}")
    if index.ndim != x.ndim:
        raise ShapeError(f"gather: index must have the input's rank {x.ndim}, got rank {index.ndim} "
                         f"(input {show_shape(x.dims)}, index {show_shape(index.dims)})")
    if x.ndim == 0:
        return gather(x.reshape(1), 0, index.reshape(1)).reshape()
    d = normalize_dim(dim, x.ndim)
    for k, (have, want) in enumerate(zip(x.dims, index.dims)):
        if k == d or have == want:
            continue
        if have.is_const and want.is_const and want.value > have.value:
            raise ShapeError(f"gather: index size {want} exceeds the input size {have} at dim {k} "
                             f"(input {show_shape(x.dims)}, index {show_shape(index.dims)})")
        x = x.narrow(k, 0, want)  # only the leading part of x is read on the other dims
    table = _move_dim(x, d, -1).unsqueeze(d)  # (..., 1 at d, ..., n): broadcasts over index's dim d
    return (one_hot(index, x.dims[d]) * table).sum(-1)


def index_select(x: GraphTensor, dim: int, index: GraphTensor) -> GraphTensor:
    """torch.index_select: the slices of x at positions `index` (1-D) along `dim`.

    A matmul of x (dim moved last) with the transposed one-hot of the indices.
    """
    if not isinstance(index, GraphTensor):
        raise UnsupportedError(f"index_select: index must be a GraphTensor (a graph input), got {type(index).__name__}")
    if index.ndim > 1:
        raise ShapeError(f"index_select: index must be 1-D, got shape {show_shape(index.dims)}")
    if x.ndim == 0:
        return index_select(x.reshape(1), 0, index).reshape(index.dims)
    d = normalize_dim(dim, x.ndim)
    selected = _move_dim(x, d, -1) @ one_hot(index.reshape(-1), x.dims[d]).mT
    return _move_dim(selected, -1, d)


def embedding(input: GraphTensor, weight: GraphTensor, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False) -> GraphTensor:
    """torch.nn.functional.embedding: rows of `weight` (num_embeddings, dim) at the indices `input`.

    one_hot(input, num_embeddings) @ weight. padding_idx, scale_grad_by_freq and sparse only
    affect gradients in PyTorch and are accepted; max_norm (renormalizing weight) is unsupported.
    """
    if max_norm is not None:
        raise UnsupportedError("embedding: max_norm is not supported (it rewrites the weight in place)")
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got {show_shape(weight.dims)}")
    return one_hot(input, weight.dims[0]) @ weight


# -- tiling and rotating -----------------------------------------------------------------------
def repeat(x: GraphTensor, *sizes) -> GraphTensor:
    """torch.Tensor.repeat: tile x sizes[k] times along each dim (extra sizes add leading dims).

    A view that expands a size-1 axis in front of every dim, then a reshape merging each pair.
    """
    sizes = [parse_dim(s) for s in _sizes(sizes)]
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ShapeError(f"repeat: {len(sizes)} sizes given for a tensor of rank {x.ndim}; need at least {x.ndim}")
    dims = [sym(1)] * lead + list(x.dims)
    interleaved = [v for d in dims for v in (sym(1), d)]
    tiled = [v for r, d in zip(sizes, dims) for v in (r, d)]
    return x.reshape(*interleaved).expand(*tiled).reshape(*[r * d for r, d in zip(sizes, dims)])


def repeat_interleave(x: GraphTensor, repeats, dim=None, *, output_size=None) -> GraphTensor:
    """torch.repeat_interleave with an int `repeats`: each element repeated in place along dim
    (the flattened tensor when dim is None). Tensor repeats would need the data: unsupported."""
    if not is_int(repeats) or repeats < 0:
        raise UnsupportedError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r}")
    if dim is None:
        x, dim = x.reshape(-1), 0
    d = normalize_dim(dim, x.ndim)
    expanded = x.unsqueeze(d + 1).expand(*x.dims[:d + 1], repeats, *x.dims[d + 1:])
    return expanded.reshape(*x.dims[:d], x.dims[d] * repeats, *x.dims[d + 1:])


def roll(x: GraphTensor, shifts, dims=None) -> GraphTensor:
    """torch.roll: shift elements along dims, wrapping around (the flattened tensor if dims is None).

    Each shift is the cat of two slices, so symbolic sizes work (the split point is shift mod n).
    """
    if dims is None:
        if not is_int(shifts):
            raise ShapeError(f"roll: without dims, shifts must be one int, got {shifts!r}")
        return roll(x.reshape(-1), shifts, 0).reshape(*x.dims)
    shifts = (shifts,) if is_int(shifts) else tuple(shifts)
    dims = (dims,) if is_int(dims) else tuple(dims)
    if len(shifts) != len(dims):
        raise ShapeError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    for shift, dim in zip(shifts, dims):
        d = normalize_dim(dim, x.ndim)
        n = x.dims[d]
        if n == sym(0):
            continue
        k = sym(shift) % n  # the last k elements move to the front
        if k != sym(0):
            x = cat([x.narrow(d, n - k, k), x.narrow(d, 0, n - k)], d)
    return x


# -- joining -----------------------------------------------------------------------------------
def cat(tensors: Sequence[GraphTensor], dim: int = 0) -> GraphTensor:
    """torch.cat: join tensors along `dim`; all other sizes must match.

    Each input is zero-padded to the total length at its offset and the results are added, so
    sizes along `dim` may be symbolic.
    """
    tensors = _tensor_list(tensors, "cat")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise ShapeError(f"cat: tensor {i} is 0-d; zero-dimensional tensors cannot be concatenated")
        if t.ndim != first.ndim:
            raise ShapeError(f"cat: tensors must have the same rank; tensor 0 has shape {show_shape(first.dims)}, "
                             f"tensor {i} has shape {show_shape(t.dims)}")
    d = normalize_dim(dim, first.ndim)
    for i, t in enumerate(tensors):
        for k, (a, b) in enumerate(zip(first.dims, t.dims)):
            if k != d and a != b:
                raise ShapeError(f"cat: sizes must match except in dim {d}; tensor {i} has size {b} at dim {k}, "
                                 f"expected {a} (tensor 0 {show_shape(first.dims)}, tensor {i} {show_shape(t.dims)})")
    if len(tensors) == 1:
        return first
    total = sum((t.dims[d] for t in tensors), sym(0))
    starts = accumulate((t.dims[d] for t in tensors), initial=sym(0))
    # zero padding by (possibly symbolic) amounts is a view: no data moves until the adds
    placed = [t._view(t.tracker.pad(d, start, total - start - t.dims[d])) for t, start in zip(tensors, starts)]
    return sum(placed[1:], placed[0])


def stack(tensors: Sequence[GraphTensor], dim: int = 0) -> GraphTensor:
    """torch.stack: join equally shaped tensors along a new dim (unsqueeze, then cat)."""
    tensors = _tensor_list(tensors, "stack")
    for i, t in enumerate(tensors):
        if t.dims != tensors[0].dims:
            raise ShapeError(f"stack: all tensors must have the same shape; tensor 0 has shape "
                             f"{show_shape(tensors[0].dims)}, tensor {i} has shape {show_shape(t.dims)}")
    d = normalize_dim(dim, tensors[0].ndim + 1)
    return cat([t.unsqueeze(d) for t in tensors], d)


def _tensor_list(tensors, op: str) -> list[GraphTensor]:
    if isinstance(tensors, GraphTensor) or not isinstance(tensors, Sequence):
        raise ShapeError(f"{op}: expected a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ShapeError(f"{op}: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, GraphTensor):
            raise ShapeError(f"{op}: tensor {i} is a {type(t).__name__}, not a GraphTensor")
        if t.graph is not tensors[0].graph:
            raise ShapeError(f"{op}: tensor {i} belongs to a different graph")
    return list(tensors)


# -- splitting (views) -------------------------------------------------------------------------
def split(x: GraphTensor, split_size_or_sections, dim: int = 0) -> tuple[GraphTensor, ...]:
    """torch.split: views of `split_size` along dim (the last may be shorter), or of the given
    section sizes, which must add up to the dim (they may be symbolic, e.g. [2, "s" - 2])."""
    d = normalize_dim(dim, x.ndim)
    n = x.dims[d]
    if is_int(split_size_or_sections):
        size = split_size_or_sections
        length = _known(n, "split", f"dim {d} when splitting by size (pass a list of sections)")
        if size < 0 or (size == 0 and length):
            raise ShapeError(f"split: split_size must be a positive int, got {size}")
        sections = [min(size, length - start) for start in range(0, length, size)] if length else [0]
    else:
        sections = [parse_dim(s) for s in split_size_or_sections]
        if sum(sections, sym(0)) != n:
            raise ShapeError(f"split: sections {tuple(map(str, sections))} must add up to {n}, the size of dim {d}")
    starts = accumulate(sections, initial=sym(0))
    return tuple(x.narrow(d, start, size) for start, size in zip(starts, sections))


def chunk(x: GraphTensor, chunks: int, dim: int = 0) -> tuple[GraphTensor, ...]:
    """torch.chunk: split into `chunks` views of ceil(n / chunks) (fewer if n is small)."""
    if not is_int(chunks) or chunks < 1:
        raise ShapeError(f"chunk: chunks must be an int >= 1, got {chunks!r}")
    d = normalize_dim(dim, x.ndim)
    n = _known(x.dims[d], "chunk", f"dim {d}")
    return split(x, max(-(-n // chunks), 1), d)


def unbind(x: GraphTensor, dim: int = 0) -> tuple[GraphTensor, ...]:
    """torch.unbind: the views x.select(dim, i) for every i."""
    d = normalize_dim(dim, x.ndim)
    n = _known(x.dims[d], "unbind", f"dim {d}")
    return tuple(x[(slice(None),) * d + (i,)] for i in range(n))


GRAPH_METHODS = {"arange": arange, "zeros": zeros, "ones": ones, "full": full, "eye": eye}
METHODS = {"tril": tril, "triu": triu, "masked_fill": masked_fill, "gather": gather, "index_select": index_select,
           "repeat": repeat, "repeat_interleave": repeat_interleave, "roll": roll,
           "split": split, "chunk": chunk, "unbind": unbind}
FUNCTIONS = {"zeros_like": zeros_like, "ones_like": ones_like, "full_like": full_like,
             "one_hot": one_hot, "embedding": embedding,
             "cat": cat, "concat": cat, "concatenate": cat, "stack": stack}
