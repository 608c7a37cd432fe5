"""ONNX shape, view, indexing, casting and quantization ops, composed of luminar view ops.

Shape-valued inputs (Reshape's shape, Slice's starts, Pad's pads, ...) must be known at load
time: they are usually folded constants. Shape/Size of a runtime tensor are load-time values
too (the static shape, with symbolic `Expr`s where the graph has dim_params).

Indexing with runtime indices (Gather, GatherElements, GatherND, Scatter*) is a one-hot of the
indices against an arange, multiplied with the data and summed (DESIGN.md section 3); indices
known at load time that pick a single position or a contiguous range become slicing views.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..library.indexing import cat as lm_cat
from ..shape import index_var
from ..symbolic import Expr, sym
from .registry import NARROW_INTS, Traced, dtype_of, integer_kind, is_const, is_float, known_dims, op, to_int

_INT_MAX = 2 ** 62


def _same(ctx, x, tensor):
    return ctx.traced(tensor, dtype_of(x))


def _dims(t) -> list:
    return [to_int(d) for d in t.dims]


def _axis(a, rank):
    a = int(a)
    if not -max(rank, 1) <= a < max(rank, 1):
        raise ShapeError(f"axis {a} is out of range for rank {rank}")
    return a % max(rank, 1)


# -- shape queries --------------------------------------------------------------------------------
@op("Shape")
def shape(ctx, x):
    dims = _dims(ctx.tensor(x)) if isinstance(x, Traced) else list(x.shape)
    start, end = ctx.attr("start", 0), ctx.attr("end")
    rank = len(dims)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    dims = dims[start:end]
    if any(isinstance(d, Expr) for d in dims):
        return np.array(dims, dtype=object)
    return np.array(dims, dtype=np.int64)


@op("Size")
def size(ctx, x):
    n = to_int(math.prod(ctx.tensor(x).dims, start=sym(1)))
    return np.array(n, dtype=object if isinstance(n, Expr) else np.int64)


# -- reshaping --------------------------------------------------------------------------------------
@op("Reshape")
def reshape(ctx, x, shape=None):
    t = ctx.tensor(x)
    target = list(ctx.attr("shape")) if ctx.opset < 5 else ctx.ints(shape, "the target shape", 1)
    if not ctx.attr("allowzero", 0):
        target = [t.dims[k] if (not isinstance(s, Expr) and s == 0) else s for k, s in enumerate(target)]
    return _same(ctx, x, t.reshape(*target))


@op("Flatten")
def flatten(ctx, x):
    t = ctx.tensor(x)
    axis = ctx.attr("axis", 1)
    axis = axis + t.ndim if axis < 0 else axis
    outer = math.prod(t.dims[:axis], start=sym(1))
    return _same(ctx, x, t.reshape(outer, math.prod(t.dims[axis:], start=sym(1))))


def _axes(ctx, axes, index, attr_until):
    if ctx.opset < attr_until:
        return list(ctx.attr("axes", []))
    return [] if axes is None else ctx.ints(axes, "axes", index)


@op("Squeeze")
def squeeze(ctx, x, axes=None):
    t = ctx.tensor(x)
    axes = _axes(ctx, axes, 1, 13)
    if not axes:
        return _same(ctx, x, t.reshape(*[d for d in t.dims if d != sym(1)]))
    drop = {_axis(a, t.ndim) for a in axes}
    for a in drop:
        if t.dims[a] != sym(1):
            raise ShapeError(f"cannot squeeze axis {a} of size {t.dims[a]}")
    return _same(ctx, x, t.reshape(*[d for k, d in enumerate(t.dims) if k not in drop]))


@op("Unsqueeze")
def unsqueeze(ctx, x, axes=None):
    t = ctx.tensor(x)
    axes = _axes(ctx, axes, 1, 13)
    rank = t.ndim + len(axes)
    dims = list(t.dims)
    for a in sorted(_axis(a, rank) for a in axes):
        dims.insert(a, 1)
    return _same(ctx, x, t.reshape(*dims))


@op("Transpose")
def transpose(ctx, x):
    t = ctx.tensor(x)
    perm = ctx.attr("perm") or list(reversed(range(t.ndim)))
    return _same(ctx, x, t.permute(*perm) if t.ndim else t)


@op("Concat")
def concat(ctx, *values):
    tensors = [ctx.tensor(v) for v in values if v is not None]
    axis = _axis(ctx.attr("axis"), tensors[0].ndim)
    nonempty = [t for t in tensors if t.dims[axis] != sym(0)] or tensors[:1]
    if len(nonempty) == 1:
        return _same(ctx, values[0], nonempty[0] + 0.0)
    return _same(ctx, values[0], lm_cat(nonempty, axis))


@op("Split")
def split(ctx, x, sizes=None):
    t = ctx.tensor(x)
    axis = _axis(ctx.attr("axis", 0), t.ndim)
    n = to_int(t.dims[axis])
    count = len(ctx.node.output)
    if ctx.opset < 13:
        sizes = ctx.attr("split")
    elif sizes is not None:
        sizes = ctx.ints(sizes, "split", 1)
    if not sizes:
        parts = ctx.attr("num_outputs", count)
        if isinstance(n, Expr):
            raise UnsupportedError(f"Split of the symbolic size {n} needs explicit split sizes")
        chunk = -(-n // parts)
        sizes = [min(chunk, n - k * chunk) for k in range(parts)]
    outs, start = [], 0
    for s in sizes:
        outs.append(_same(ctx, x, t.narrow(axis, start, s)))
        start = start + s
    return tuple(outs)


# -- slicing and padding ------------------------------------------------------------------------------
@op("Slice")
def slice_(ctx, x, starts=None, ends=None, axes=None, steps=None):
    t = ctx.tensor(x)
    if ctx.opset < 10:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.ints(starts, "starts", 1), ctx.ints(ends, "ends", 2)
        axes = list(range(len(starts))) if axes is None else ctx.ints(axes, "axes", 3)
        steps = [1] * len(starts) if steps is None else ctx.ints(steps, "steps", 4)
    index = [slice(None)] * t.ndim
    for a, start, end, step in zip(axes, starts, ends, steps):
        a = _axis(a, t.ndim)
        if step == 0:
            raise ShapeError("Slice step must not be 0")
        if step < 0:
            n = to_int(t.dims[a])
            if isinstance(n, Expr):
                raise UnsupportedError(f"Slice with a negative step over the symbolic size {n}")
            lo, hi, st = slice(start, end, step).indices(n)
            count = len(range(lo, hi, st))
            t = t.flip(a)  # reversed index j = n - 1 - i
            index[a] = slice(n - 1 - lo, n - 1 - lo + (count - 1) * (-st) + 1 if count else n - 1 - lo, -st)
            continue
        index[a] = slice(None if not isinstance(start, Expr) and start == 0 else start,
                         None if not isinstance(end, Expr) and end >= _INT_MAX // 4 else end,
                         step if step != 1 else None)
    out = t[tuple(index)] if t.ndim else t
    return _same(ctx, x, out)


def _edge_pad(t, axis, before, after, mode):
    """Pad one axis by repeating (edge), mirroring (reflect) or wrapping (wrap) its elements."""
    n = to_int(t.dims[axis])
    if isinstance(n, Expr):
        raise UnsupportedError(f"Pad mode {mode!r} over the symbolic size {n}")
    parts = []
    if mode == "edge":
        first, last = t.narrow(axis, 0, 1), t.narrow(axis, n - 1, 1)
        expand = lambda part, k: part.expand(*[k if d == axis else -1 for d in range(t.ndim)])
        if before:
            parts.append(expand(first, before))
        parts.append(t)
        if after:
            parts.append(expand(last, after))
    elif mode == "reflect":
        if before:
            parts.append(t.narrow(axis, 1, before).flip(axis))
        parts.append(t)
        if after:
            parts.append(t.narrow(axis, n - 1 - after, after).flip(axis))
    else:  # wrap
        if before:
            parts.append(t.narrow(axis, n - before, before))
        parts.append(t)
        if after:
            parts.append(t.narrow(axis, 0, after))
    return lm_cat(parts, axis) if len(parts) > 1 else t


def _pad_with_blocks(ctx, t, before: dict, after: dict, fill: float):
    """Constant padding by a non-finite value (graph constants are finite): known blocks of `fill`
    concatenated on each side (negative amounts crop first)."""
    for a in sorted(set(before) | set(after)):
        b, e = before.get(a, 0), after.get(a, 0)
        if b < 0:
            t, b = t.narrow(a, -b, to_int(t.dims[a]) + b), 0
        if e < 0:
            t, e = t.narrow(a, 0, to_int(t.dims[a]) + e), 0
        shape = known_dims(t.dims, "Pad with a non-finite value")
        parts = []
        for amount in (b, e):
            block = list(shape)
            block[a] = amount
            parts.append(ctx.tensor(np.full(block, fill, np.float32)) if amount else None)
        pieces = [p for p in (parts[0], t, parts[1]) if p is not None]
        t = lm_cat(pieces, a) if len(pieces) > 1 else t
    return t


@op("Pad")
def pad(ctx, x, pads=None, value=None, axes=None):
    t = ctx.tensor(x)
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads, fill = list(ctx.attr("pads")), ctx.attr("value", 0.0)
        axes = list(range(t.ndim))
    else:
        pads = ctx.ints(pads, "pads", 1)
        fill = 0.0 if value is None else float(np.asarray(ctx.const(value, "constant_value", 2)).reshape(-1)[0]) \
            if np.asarray(ctx.const(value, "constant_value", 2)).size else 0.0
        axes = list(range(t.ndim)) if axes is None else [_axis(a, t.ndim) for a in ctx.ints(axes, "axes", 3)]
    k = len(axes)
    if len(pads) != 2 * k:
        raise ShapeError(f"Pad: expected {2 * k} pads for {k} axes, got {len(pads)}")
    before, after = dict(zip(axes, pads[:k])), dict(zip(axes, pads[k:]))
    if mode == "constant":
        flat = []
        for a in reversed(range(t.ndim)):
            flat += [before.get(a, 0), after.get(a, 0)]
        if not math.isfinite(fill):
            return _same(ctx, x, _pad_with_blocks(ctx, t, before, after, fill))
        return _same(ctx, x, t.pad(flat, value=fill) if any(flat) else t + 0.0)
    if mode not in ("edge", "reflect", "wrap"):
        raise UnsupportedError(f"Pad mode {mode!r}")
    for a in axes:
        b, e = before.get(a, 0), after.get(a, 0)
        if b < 0 or e < 0:
            raise UnsupportedError(f"Pad mode {mode!r} with negative pads")
        if b or e:
            t = _edge_pad(t, a, b, e, mode)
    return _same(ctx, x, t)


@op("Tile")
def tile(ctx, x, repeats):
    t = ctx.tensor(x)
    return _same(ctx, x, t.repeat(*ctx.ints(repeats, "repeats", 1)) if t.ndim else t + 0.0)


@op("Expand")
def expand(ctx, x, shape):
    t = ctx.tensor(x)
    target = ctx.ints(shape, "the target shape", 1)
    rank = max(t.ndim, len(target))
    have = [sym(1)] * (rank - t.ndim) + list(t.dims)
    want = [sym(1)] * (rank - len(target)) + [sym(s) for s in target]
    out = [h if w == sym(1) else w for h, w in zip(have, want)]
    return _same(ctx, x, t.broadcast_to(out) if tuple(out) != tuple(t.dims) else t + 0.0)


@op("DepthToSpace")
def depth_to_space(ctx, x):
    t, b = ctx.tensor(x), ctx.attr("blocksize")
    n, c, h, w = t.dims
    if ctx.attr("mode", "DCR") == "DCR":
        y = t.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = t.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return _same(ctx, x, y.reshape(n, c // (b * b), h * b, w * b))


@op("SpaceToDepth")
def space_to_depth(ctx, x):
    t, b = ctx.tensor(x), ctx.attr("blocksize")
    n, c, h, w = t.dims
    y = t.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return _same(ctx, x, y.reshape(n, c * b * b, h // b, w // b))


# -- casting --------------------------------------------------------------------------------------
def _cast(ctx, x, target: np.dtype):
    t = ctx.tensor(x)
    kind = integer_kind(target)
    if kind == "b":
        return ctx.traced(t.ne(0.0), target)
    if kind in ("i", "u"):
        if is_float(dtype_of(x)):
            t = t.trunc()  # float -> int truncates toward zero
        if target.name in NARROW_INTS:  # sub-byte ints wrap around (two's complement), as ONNX casts them
            low, high = NARROW_INTS[target.name]
            t = (t - low).remainder(float(high - low + 1)) + low
        return ctx.traced(t + 0.0, target)
    if not is_float(target):
        raise UnsupportedError(f"Cast to {target} is not supported")
    if target.name.startswith(("float8", "float4")) and ctx.attr("saturate", 1):
        import ml_dtypes
        limit = float(ml_dtypes.finfo(target).max)
        t = t.clamp(-limit, limit)  # saturate: out-of-range values become the largest finite ones
    # narrower float results are rounded when the model returns them, not inside the graph
    return ctx.traced(t + 0.0, target)


@op("Cast")
def cast(ctx, x):
    from onnx import helper
    return _cast(ctx, x, np.dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("to"))))


@op("CastLike")
def cast_like(ctx, x, like):
    if is_const(x) and x.dtype != object:  # only `like`'s dtype matters: a known x stays known
        return x.astype(dtype_of(like))
    return _cast(ctx, x, dtype_of(like))


@op("Dropout")
def dropout(ctx, x, ratio=None, training=None):
    if training is not None and bool(np.asarray(ctx.const(training, "training_mode", 2)).reshape(-1)[0]):
        raise UnsupportedError("Dropout in training mode (random masks) is not supported")
    out = _same(ctx, x, ctx.tensor(x) + 0.0)
    mask = ctx.traced(ctx.graph.constant(1.0, ctx.tensor(x).dims), np.bool_)
    return out, mask


# -- constants made of shapes ------------------------------------------------------------------------
@op("ConstantOfShape")
def constant_of_shape(ctx, shape):
    dims = ctx.ints(shape, "the shape", 0)
    value = ctx.attr("value", np.zeros(1, dtype=np.float32))
    if not any(isinstance(d, Expr) for d in dims) and math.prod(dims) <= 4096:
        return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)
    return ctx.traced(ctx.graph.constant(float(value.reshape(-1)[0]), dims), value.dtype)


@op("Range")
def range_(ctx, start, limit, delta):
    ctx.const(start, "start", 0), ctx.const(limit, "limit", 1), ctx.const(delta, "delta", 2)
    raise UnsupportedError("Range with symbolic bounds")


@op("EyeLike")
def eye_like(ctx, x):
    from onnx import helper
    t = ctx.tensor(x)
    rows, cols = t.dims
    k = ctx.attr("k", 0)
    i, j = index_var(0, rows), index_var(1, cols)
    diff = j - i
    eye = ctx.graph.constant(diff.ge(k) & diff.lt(k + 1), (rows, cols))
    dtype = helper.tensor_dtype_to_np_dtype(ctx.attr("dtype")) if "dtype" in ctx.attrs else dtype_of(x)
    return ctx.traced(eye, dtype)


@op("Trilu")
def trilu(ctx, x, k=None):
    t = ctx.tensor(x)
    diagonal = 0 if k is None else ctx.ints(k, "k", 1)[0]
    return _same(ctx, x, t.triu(diagonal) if ctx.attr("upper", 1) else t.tril(diagonal))


@op("OneHot")
def one_hot(ctx, indices, depth, values):
    n = int(np.asarray(ctx.const(depth, "depth", 1)).reshape(-1)[0])
    vals = ctx.const(values, "values", 2).reshape(-1)
    off, on = float(vals[0]), float(vals[1])
    idx = ctx.tensor(indices)
    idx = idx + idx.lt(0.0) * float(n)  # negative indices count from the end
    hot = _one_hot(idx, n)
    out = hot * (on - off) + off
    axis = ctx.attr("axis", -1)
    rank = out.ndim
    axis = axis % rank
    if axis != rank - 1:
        order = list(range(rank - 1))
        order.insert(axis, rank - 1)
        out = out.permute(*order)
    return ctx.traced(out, vals.dtype)


def _one_hot(index, n):
    """(..., n): 1.0 where the last axis position equals index (out-of-range indices give zeros)."""
    return index.unsqueeze(-1).eq(index.graph.arange(n))


# -- gathering ----------------------------------------------------------------------------------------
def _constant_indices(ctx, indices, n):
    idx = np.asarray(indices).astype(np.int64)
    if isinstance(n, int):
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise ShapeError(f"indices {idx.min()}..{idx.max()} are out of range for an axis of size {n}")
        idx = np.where(idx < 0, idx + n, idx)
    return idx


@op("Gather")
def gather(ctx, data, indices):
    t = ctx.tensor(data)
    axis = _axis(ctx.attr("axis", 0), t.ndim)
    n = to_int(t.dims[axis])
    if is_const(indices):
        idx = _constant_indices(ctx, indices, n)
        flat = idx.reshape(-1)
        if flat.size and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
            part = t.narrow(axis, int(flat[0]), flat.size)  # a contiguous run: a slicing view
            return _same(ctx, data, part.reshape(*t.dims[:axis], *idx.shape, *t.dims[axis + 1:]))
        index = ctx.tensor(idx.astype(np.int32))
    else:
        index = ctx.tensor(indices)
        index = index + index.lt(0.0) * t.dims[axis].value if t.dims[axis].is_const else index
    picked = t.index_select(axis, index.reshape(-1))
    return _same(ctx, data, picked.reshape(*t.dims[:axis], *index.dims, *t.dims[axis + 1:]))


def _wrap_negative(index, n):
    return index + index.lt(0.0) * float(n) if isinstance(n, int) else index


@op("GatherElements")
def gather_elements(ctx, data, indices):
    t = ctx.tensor(data)
    axis = _axis(ctx.attr("axis", 0), t.ndim)
    index = _wrap_negative(ctx.tensor(indices), to_int(t.dims[axis]))
    return _same(ctx, data, t.gather(axis, index))


def _linear_index(index, sizes):
    """sum_j index[..., j] * stride_j over the last axis (row-major strides of `sizes`)."""
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
    out = None
    for j, (size, stride) in enumerate(zip(sizes, strides)):
        part = _wrap_negative(index.narrow(-1, j, 1).squeeze(-1), size) * float(stride)
        out = part if out is None else out + part
    return out


@op("GatherND")
def gather_nd(ctx, data, indices):
    t, index = ctx.tensor(data), ctx.tensor(indices)
    b = ctx.attr("batch_dims", 0)
    k = to_int(index.dims[-1])
    sizes = [to_int(d) for d in t.dims[b:b + k]]
    if any(isinstance(s, Expr) for s in sizes) or isinstance(k, Expr):
        raise UnsupportedError("GatherND over symbolic sizes")
    rest = list(t.dims[b + k:])
    table = t.reshape(*t.dims[:b], math.prod(sizes), *rest)  # (batch..., P, rest...)
    lin = _linear_index(index, sizes)  # (batch..., m...)
    hot = _one_hot(lin, math.prod(sizes))  # (batch..., m..., P)
    m = lin.ndim - b
    hot = hot.reshape(*hot.dims, *([1] * len(rest)))
    table = table.reshape(*t.dims[:b], *([1] * m), math.prod(sizes), *rest)
    return _same(ctx, data, (hot * table).sum(b + m))


# -- scattering ---------------------------------------------------------------------------------------
def _scatter_rows(data, hot, updates, reduction):
    """Combine data (P, ...) with updates (M, ...) sent to rows by hot (M, P)."""
    sent = (hot.unsqueeze(-1) * updates.unsqueeze(1)).sum(0) if updates.ndim == 2 else None
    if sent is None:
        raise RuntimeError("internal: updates must be 2-D here")
    written = hot.sum(0).unsqueeze(-1).minimum(1.0)
    if reduction == "none":
        return data * (1.0 - written) + sent
    if reduction == "add":
        return data + sent
    raise UnsupportedError(f"scatter reduction {reduction!r} is not supported")


@op("ScatterND")
def scatter_nd(ctx, data, indices, updates):
    t, index, upd = ctx.tensor(data), ctx.tensor(indices), ctx.tensor(updates)
    k = to_int(index.dims[-1])
    sizes = [to_int(d) for d in t.dims[:k]]
    if any(isinstance(s, Expr) for s in sizes + [k]):
        raise UnsupportedError("ScatterND over symbolic sizes")
    rows = math.prod(sizes)
    rest = list(t.dims[k:])
    width = math.prod(rest, start=sym(1))
    lin = _linear_index(index, sizes).reshape(-1)
    hot = _one_hot(lin, rows)  # (M, P)
    out = _scatter_rows(t.reshape(rows, width), hot, upd.reshape(-1, width), ctx.attr("reduction", "none"))
    return _same(ctx, data, out.reshape(*t.dims))


@op("ScatterElements", "Scatter")
def scatter_elements(ctx, data, indices, updates):
    t, index, upd = ctx.tensor(data), ctx.tensor(indices), ctx.tensor(updates)
    axis = _axis(ctx.attr("axis", 0), t.ndim)
    n = to_int(t.dims[axis])
    index = _wrap_negative(index, n)
    # positions along the other axes: the update at index position p lands at p with axis replaced
    hot = _one_hot(index, n)  # (*index.shape, n)
    upd_hot = hot * upd.unsqueeze(-1)
    sent = upd_hot.sum(axis)  # (*index.shape without axis, n): summed over the index positions along axis
    written = hot.sum(axis).minimum(1.0)
    # move the new axis n into `axis` and zero-pad the other dims up to data's sizes
    order = list(range(sent.ndim - 1))
    order.insert(axis, sent.ndim - 1)
    sent, written = sent.permute(*order), written.permute(*order)
    pads = []
    for d in reversed(range(t.ndim)):
        pads += [0, 0 if d == axis else to_int(t.dims[d]) - to_int(sent.dims[d])]
    if any(pads):
        sent, written = sent.pad(pads), written.pad(pads)
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        return _same(ctx, data, t * (1.0 - written) + sent)
    if reduction == "add":
        return _same(ctx, data, t + sent)
    raise UnsupportedError(f"ScatterElements reduction {reduction!r} is not supported")


# -- quantization -------------------------------------------------------------------------------------
def _per_axis(ctx, param, rank, axis, what, index, data=None):
    """A scale or zero point (scalar, 1-D along axis, or blocked) shaped to broadcast against the data."""
    p = ctx.tensor(param)
    block = ctx.attr("block_size", 0)
    if block and p.ndim == rank:  # one value per `block` elements along axis
        a = _axis(axis, rank)
        return p.repeat_interleave(block, a).narrow(a, 0, data.dims[a])
    if p.ndim == 1 and rank > 1:
        shape = [1] * rank
        shape[_axis(axis, rank)] = p.dims[0]
        p = p.reshape(*shape)
    return p


_QUANT_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
                "int32": (-2 ** 31, 2 ** 31 - 1), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


@op("QuantizeLinear")
def quantize_linear(ctx, x, scale, zero_point=None):
    t = ctx.tensor(x)
    axis = ctx.attr("axis", 1)
    out_dtype = dtype_of(zero_point) if zero_point is not None else np.dtype(np.uint8)
    if ctx.attr("output_dtype"):
        from onnx import helper
        out_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("output_dtype")))
    if out_dtype.name not in _QUANT_RANGE:
        raise UnsupportedError(f"QuantizeLinear to {out_dtype}")
    q = (t / _per_axis(ctx, scale, t.ndim, axis, "scale", 1, t)).round()
    if zero_point is not None:
        q = q + _per_axis(ctx, zero_point, t.ndim, axis, "zero point", 2, t)
    low, high = _QUANT_RANGE[out_dtype.name]
    return ctx.traced(q.clamp(float(low), float(high)), out_dtype)


@op("DequantizeLinear")
def dequantize_linear(ctx, x, scale, zero_point=None):
    t = ctx.tensor(x)
    axis = ctx.attr("axis", 1)
    if zero_point is not None:
        t = t - _per_axis(ctx, zero_point, t.ndim, axis, "zero point", 2, t)
    out = t * _per_axis(ctx, scale, t.ndim, axis, "scale", 1, t)
    return ctx.traced(out, dtype_of(scale))


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx, x):
    t = ctx.tensor(x)
    low, high = t.amin().minimum(0.0), t.amax().maximum(0.0)
    scale = (high - low) * (1.0 / 255.0)
    zero = (0.0 - low / scale).round().clamp(0.0, 255.0)
    q = ((t / scale).round() + zero).clamp(0.0, 255.0)
    return ctx.traced(q, np.uint8), ctx.traced(scale, np.float32), ctx.traced(zero, np.uint8)


@op("MatMulInteger")
def matmul_integer(ctx, a, b, a_zero=None, b_zero=None):
    x, y = ctx.tensor(a), ctx.tensor(b)
    if a_zero is not None:
        z = ctx.tensor(a_zero)
        x = x - (z.reshape(-1, 1) if z.ndim == 1 and z.dims[0] != sym(1) else z.reshape(*[1] * z.ndim))
    if b_zero is not None:
        y = y - ctx.tensor(b_zero)
    return ctx.traced(x @ y, np.int32)


@op("QLinearMatMul")
def qlinear_matmul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
    x = (ctx.tensor(a) - ctx.tensor(a_zero)) * ctx.tensor(a_scale)
    w = (ctx.tensor(b) - ctx.tensor(b_zero)) * ctx.tensor(b_scale)
    q = ((x @ w) / ctx.tensor(y_scale)).round() + ctx.tensor(y_zero)
    low, high = _QUANT_RANGE[dtype_of(y_zero).name]
    return ctx.traced(q.clamp(float(low), float(high)), dtype_of(y_zero))



@op("Compress")
def compress(ctx, x, condition):
    """Compress with a condition known at load time: a selection by constant indices."""
    keep = np.flatnonzero(np.asarray(ctx.const(condition, "the condition", 1)).reshape(-1))
    t = ctx.tensor(x)
    axis = ctx.attr("axis")
    if axis is None:
        t, axis = t.reshape(-1), 0
    axis = _axis(axis, t.ndim)
    keep = keep[keep < to_int(t.dims[axis])]
    return _same(ctx, x, t.index_select(axis, ctx.tensor(keep.astype(np.int32))))


@op("ReverseSequence")
def reverse_sequence(ctx, x, lengths):
    """Each batch entry's first lengths[b] steps reversed: a gather along time by a constant index."""
    t = ctx.tensor(x)
    lens = np.asarray(ctx.const(lengths, "sequence_lens", 1)).astype(np.int64)
    batch_axis, time_axis = ctx.attr("batch_axis", 1), ctx.attr("time_axis", 0)
    shape = known_dims(t.dims, "ReverseSequence")
    steps = np.arange(shape[time_axis])
    index = np.where(steps[None, :] < lens[:, None], lens[:, None] - 1 - steps[None, :], steps[None, :])  # (B, T)
    if batch_axis > time_axis:
        index = index.T
    view = [1] * len(shape)
    view[batch_axis], view[time_axis] = shape[batch_axis], shape[time_axis]
    full = np.broadcast_to(index.reshape(view), shape).astype(np.int32)
    return _same(ctx, x, t.gather(time_axis, ctx.tensor(np.ascontiguousarray(full))))
