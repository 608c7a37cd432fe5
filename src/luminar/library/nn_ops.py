"""torch.nn.functional's normalizations, convolutions and pooling, composed from view ops and primitives.

Convolution and pooling read their windows through views (`pad` and `unfold`). A convolution is
a matmul of the columns (N * positions, in-channels * kernel positions), a reshape of the
windowed input, against the flattened weight: the reshape is a Contiguous node the compiler
fuses into its readers (im2col in the index math, not a buffer), and the matmul form makes each
of the three products of training one flat reduction: the forward over in-channels x kernel, the
weight gradient over N * positions, the input gradient over out-channels. (A broadcast product
laid out (N, out-channels, *positions, ...) would make the weight gradient a nested sum over
batch and positions, which schedules far worse.) Groups are the matmul's batch axis.

Shapes follow torch: N-d ops take batched (N, C, *spatial) or unbatched (C, *spatial) input.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..graph import as_shape, parse_dim, show_shape
from ..shape import index_var
from ..tensor import is_int

# Where torch pads with -inf (max pooling): constants must be finite, so the most negative one
# that float32 still represents well. A window always holds at least one real element (padding
# is at most half the kernel), so the padding never wins unless the input itself is below it.
_NEG_BIG = -3.0e38
_FLOAT32_EPS = float(np.finfo(np.float32).eps)


# -- argument normalization ------------------------------------------------------------------------
def _ints(op: str, name: str, value, n: int, minimum: int) -> tuple[int, ...]:
    """An int or a sequence of n (or 1) ints, as n ints >= minimum (torch's expand_param_if_needed)."""
    values = (value,) * n if is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else None
    if values is not None and len(values) == 1:
        values = values * n
    if values is None or len(values) != n or not all(is_int(v) for v in values):
        raise ShapeError(f"{op}: {name} must be an int or {n} ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ShapeError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return tuple(int(v) for v in values)


def _check_input_rank(op: str, x, n: int):
    """N-d ops take (C, *spatial) or (N, C, *spatial)."""
    if not hasattr(x, "ndim"):
        raise ShapeError(f"{op}: input must be a tensor, got {type(x).__name__}")
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(f"{op}: expected {n + 1}-D (unbatched) or {n + 2}-D (batched) input, "
                         f"got {x.ndim}-D with shape {show_shape(x.dims)}")


# -- windows: the shared core of convolution and pooling ----------------------------------------------
def _pad_spatial(x, pads, value: float = 0.0):
    """Pad the last len(pads) dims by (before, after) pairs given first dim first."""
    flat = [amount for pair in reversed(pads) for amount in pair]
    return x.pad(flat, value=value) if any(flat) else x


def _windows(x, kernel, stride, dilation, op: str):
    """(..., *spatial) -> (..., *out, *kernel): sliding windows over the last len(kernel) dims, as views."""
    first = x.ndim - len(kernel)
    spatial = x.dims[first:]
    for size, k, d in zip(spatial, kernel, dilation):
        if size.is_const and size.value < d * (k - 1) + 1:
            raise ShapeError(f"{op}: padded input size {show_shape(spatial)} is smaller than the kernel "
                             f"{tuple(kernel)} (dilation {tuple(dilation)})")
    for i in range(len(kernel)):  # each unfold appends its window axis last, so the spatial positions stay put
        x = x.unfold(first + i, kernel[i], stride[i], dilation[i])
    return x


# -- normalization ----------------------------------------------------------------------------------
def _normalized(op: str, input, normalized_shape):
    """The trailing axes named by normalized_shape, checked against the input's shape."""
    shape = as_shape(normalized_shape)
    if not shape:
        raise ShapeError(f"{op}: normalized_shape must have at least one dimension, got {normalized_shape!r}")
    shape = tuple(parse_dim(d) for d in shape)
    if input.ndim < len(shape) or tuple(input.dims[input.ndim - len(shape):]) != shape:
        raise ShapeError(f"{op}: input shape {show_shape(input.dims)} does not end with normalized_shape "
                         f"{show_shape(shape)}")
    return tuple(range(-len(shape), 0)), shape


def _check_affine(op: str, name: str, param, shape):
    if param is not None and tuple(param.dims) != shape:
        raise ShapeError(f"{op}: {name} must have shape normalized_shape {show_shape(shape)}, "
                         f"got {show_shape(param.dims)}")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """torch.nn.functional.layer_norm: (x - mean) / sqrt(biased var + eps) * weight + bias over the trailing dims."""
    axes, shape = _normalized("layer_norm", input, normalized_shape)
    _check_affine("layer_norm", "weight", weight, shape)
    _check_affine("layer_norm", "bias", bias, shape)
    centered = input - input.mean(axes, keepdim=True)
    variance = (centered * centered).mean(axes, keepdim=True)
    out = centered * (variance + eps).sqrt().reciprocal()
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    """torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) * weight; eps None means float32's eps."""
    axes, shape = _normalized("rms_norm", input, normalized_shape)
    _check_affine("rms_norm", "weight", weight, shape)
    eps = _FLOAT32_EPS if eps is None else eps
    out = input * ((input * input).mean(axes, keepdim=True) + eps).sqrt().reciprocal()
    return out if weight is None else out * weight


# -- convolution ------------------------------------------------------------------------------------
def _conv_padding(op: str, padding, kernel, stride, dilation) -> list[tuple[int, int]]:
    """(before, after) per spatial dim; 'same' puts the odd extra element after, as torch does."""
    n = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * n
        if padding != "same":
            raise ShapeError(f"{op}: padding must be an int, ints, 'valid' or 'same', got {padding!r}")
        if any(s != 1 for s in stride):
            raise ShapeError(f"{op}: padding='same' is not supported for strided convolutions (stride {stride})")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in totals]
    return [(p, p) for p in _ints(op, "padding", padding, n, 0)]


def _conv(op: str, n: int, input, weight, bias, stride, padding, dilation, groups):
    """N-d convolution (cross-correlation, like torch): windows of the padded input times the weight."""
    _check_input_rank(op, input, n)
    if not hasattr(weight, "ndim") or weight.ndim != n + 2:
        raise ShapeError(f"{op}: weight must be {n + 2}-D (out_channels, in_channels/groups, *kernel), got "
                         f"{show_shape(weight.dims) if hasattr(weight, 'dims') else type(weight).__name__}")
    if not is_int(groups) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    if not all(d.is_const for d in weight.dims):
        raise UnsupportedError(f"{op}: weight shape {show_shape(weight.dims)} must have known sizes, not symbolic ones")
    out_ch, in_per_group, *kernel = (d.value for d in weight.dims)
    stride, dilation = _ints(op, "stride", stride, n, 1), _ints(op, "dilation", dilation, n, 1)
    pads = _conv_padding(op, padding, kernel, stride, dilation)
    batched = input.ndim == n + 2
    x = input if batched else input.unsqueeze(0)
    if out_ch % groups:
        raise ShapeError(f"{op}: groups={groups} must divide out_channels, got weight of shape {show_shape(weight.dims)}")
    if x.dims[1] != in_per_group * groups:
        raise ShapeError(f"{op}: expected input with {in_per_group * groups} channels (weight {show_shape(weight.dims)}, "
                         f"groups={groups}), got {x.dims[1]} channels in input of shape {show_shape(input.dims)}")
    if bias is not None and tuple(bias.dims) != (parse_dim(out_ch),):
        raise ShapeError(f"{op}: bias must have shape ({out_ch},), got {show_shape(bias.dims)}")

    x = _windows(_pad_spatial(x, pads), kernel, stride, dilation, op)  # (N, C, *out, *kernel)
    batch, out_sizes = x.dims[0], x.dims[2:2 + n]
    x = x.reshape(batch, groups, in_per_group, *out_sizes, *kernel)
    # columns (groups, N * positions, in/groups * kernel) times weight (groups, in/groups * kernel, out/groups)
    x = x.permute(1, 0, *range(3, 3 + n), 2, *range(3 + n, 3 + 2 * n))
    cols = x.reshape(groups, -1, in_per_group * math.prod(kernel))
    w = weight.reshape(groups, out_ch // groups, -1).mT
    out = cols.matmul(w)  # (groups, N * positions, out/groups)
    out = out.reshape(groups, batch, *out_sizes, out_ch // groups)
    out = out.permute(1, 0, n + 2, *range(2, n + 2)).reshape(batch, out_ch, *out_sizes)
    if bias is not None:
        out = out + bias.reshape(out_ch, *([1] * n))
    return out if batched else out.squeeze(0)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """torch.nn.functional.conv1d: input (N, C, L) or (C, L), weight (O, C/groups, k)."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """torch.nn.functional.conv2d: input (N, C, H, W) or (C, H, W), weight (O, C/groups, kh, kw)."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """torch.nn.functional.conv3d: input (N, C, D, H, W) or (C, D, H, W), weight (O, C/groups, kd, kh, kw)."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


# -- pooling ----------------------------------------------------------------------------------------
def _pool_geometry(op: str, n: int, input, kernel_size, stride, padding, dilation, ceil_mode):
    """Checked (kernel, stride, dilation, pads) where pads include ceil_mode's extra right padding."""
    _check_input_rank(op, input, n)
    kernel = _ints(op, "kernel_size", kernel_size, n, 1)
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) \
        else _ints(op, "stride", stride, n, 1)
    padding, dilation = _ints(op, "padding", padding, n, 0), _ints(op, "dilation", dilation, n, 1)
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ShapeError(f"{op}: padding must be at most half of kernel_size, got padding={padding}, "
                         f"kernel_size={kernel}")
    pads = []
    for size, k, s, p, d in zip(input.dims[input.ndim - n:], kernel, stride, padding, dilation):
        extra = 0
        if ceil_mode:
            if not size.is_const:
                raise UnsupportedError(f"{op}: ceil_mode=True needs known spatial sizes, got {show_shape(input.dims)}")
            span = size.value + 2 * p - d * (k - 1) - 1
            out = -(-span // s) + 1
            if (out - 1) * s >= size.value + p:  # the last window must start inside the input or left padding
                out -= 1
            extra = max(0, (out - 1) * s - span)
        pads.append((p, p + extra))
    return kernel, stride, dilation, pads


def _max_pool(op: str, n: int, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    if return_indices:
        raise UnsupportedError(f"{op}: return_indices=True is not supported")
    kernel, stride, dilation, pads = _pool_geometry(op, n, input, kernel_size, stride, padding, dilation, ceil_mode)
    windows = _tiles(input, kernel, stride, dilation, pads)
    if windows is None:
        windows = _windows(_pad_spatial(input, pads, _NEG_BIG), kernel, stride, dilation, op)
    return windows.amax(tuple(range(-n, 0)))


def _tiles(x, kernel, stride, dilation, pads):
    """(..., *out, *kernel) like `_windows` when the windows tile the input exactly (stride equal to
    the kernel, no dilation, no padding, sizes divisible): then they are a reshape and a permute,
    whose gradient is a reshape back, not the shifted, spread-out pads that undo a strided window."""
    n = len(kernel)
    spatial = x.dims[x.ndim - n:]
    if tuple(stride) != tuple(kernel) or any(d != 1 for d in dilation) or any(p != (0, 0) for p in pads) \
            or not all(s.is_const and s.value % k == 0 for s, k in zip(spatial, kernel)):
        return None
    lead = x.ndim - n
    split = [part for s, k in zip(spatial, kernel) for part in (s.value // k, k)]
    x = x.reshape(*x.dims[:lead], *split)
    return x.permute(*range(lead), *range(lead, lead + 2 * n, 2), *range(lead + 1, lead + 2 * n, 2))


def _avg_pool(op: str, n: int, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, dilation, pads = _pool_geometry(op, n, input, kernel_size, stride, padding, 1, ceil_mode)
    axes = tuple(range(-n, 0))
    total = _windows(_pad_spatial(input, pads), kernel, stride, dilation, op).sum(axes)
    if divisor_override is not None:
        if not is_int(divisor_override) or divisor_override < 1:
            raise ShapeError(f"{op}: divisor_override must be a positive int, got {divisor_override!r}")
        return total * (1.0 / divisor_override)
    extra = [after - before for before, after in pads]
    if count_include_pad and not any(extra):
        return total * (1.0 / math.prod(kernel))
    # Divide each window by how many elements it really covers: pool a mask of ones the same way
    # (torch counts the zero padding when count_include_pad, never ceil_mode's overhang).
    ones = input.graph.constant(1.0, input.dims[input.ndim - n:])
    if count_include_pad:
        ones = _pad_spatial(ones, [(p, p) for p, _ in pads], 1.0)
        ones = _pad_spatial(ones, [(0, e) for e in extra])
    else:
        ones = _pad_spatial(ones, pads)
    return total / _windows(ones, kernel, stride, dilation, op).sum(axes)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool1d over the last dim of (N, C, L) or (C, L)."""
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool2d over the last two dims of (N, C, H, W) or (C, H, W).

    Padding reads as -3e38 rather than torch's -inf (graph constants are finite).
    """
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """torch.nn.functional.avg_pool1d over the last dim of (N, C, L) or (C, L)."""
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool2d over the last two dims of (N, C, H, W) or (C, H, W)."""
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _adaptive_matrix(graph, size, out: int):
    """(size, out) matrix averaging input positions [floor(o*size/out), ceil((o+1)*size/out)) into output o."""
    i, o = index_var(0, size), index_var(1, out)
    start, end = (o * size) // out, ((o + 1) * size + out - 1) // out
    inside = graph.constant(i.ge(start) & i.lt(end), (size, out))
    return inside / graph.constant(end - start, (size, out))


def _adaptive_avg_pool(op: str, n: int, input, output_size):
    """Average over adaptive windows, one spatial dim at a time, as a matmul with an averaging matrix."""
    _check_input_rank(op, input, n)
    sizes = (output_size,) * n if is_int(output_size) or output_size is None else tuple(output_size)
    if len(sizes) == 1:
        sizes *= n
    spatial = input.dims[input.ndim - n:]
    if len(sizes) != n or not all(s is None or (is_int(s) and s >= 1) for s in sizes):
        raise ShapeError(f"{op}: output_size must be a positive int or {n} of them (None keeps a size), "
                         f"got {output_size!r}")
    x = input
    for i, (size, out) in enumerate(zip(spatial, sizes)):
        if out is None or size == parse_dim(out):
            continue
        dim = input.ndim - n + i
        x = x.transpose(dim, -1).matmul(_adaptive_matrix(input.graph, size, out)).transpose(dim, -1)
    return x


def adaptive_avg_pool1d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool1d: (N, C, L) or (C, L) -> (..., output_size)."""
    return _adaptive_avg_pool("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d: (N, C, H, W) or (C, H, W) -> (..., *output_size)."""
    return _adaptive_avg_pool("adaptive_avg_pool2d", 2, input, output_size)


FUNCTIONS = {
    "layer_norm": layer_norm, "rms_norm": rms_norm,
    "conv1d": conv1d, "conv2d": conv2d, "conv3d": conv3d,
    "max_pool1d": max_pool1d, "max_pool2d": max_pool2d, "avg_pool1d": avg_pool1d, "avg_pool2d": avg_pool2d,
    "adaptive_avg_pool1d": adaptive_avg_pool1d, "adaptive_avg_pool2d": adaptive_avg_pool2d,
}
