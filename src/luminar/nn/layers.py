"""Layers with parameters (Linear, Conv2d, Embedding) and the stateless wrappers (activations,
Flatten, MaxPool2d, Identity), each torch.nn's class of the same name over luminar's functions.

Initialization follows PyTorch's defaults in distribution (see init.py): Linear and Conv2d draw
weight and bias from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), Embedding from N(0, 1).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..graph import show_shape
from ..library.elementwise import gelu, relu, sigmoid, silu, tanh
from ..library.indexing import embedding
from ..library.linalg import linear
from ..library.nn_ops import conv2d, max_pool2d
from ..tensor import GraphTensor
from . import init
from .module import Module, Parameter


def positive_int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueDomainError(f"{op}: {name} must be a positive int, got {value!r}")
    return int(value)


def pair(op: str, name: str, value, minimum: int) -> tuple[int, int]:
    values = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else tuple(value)
    if len(values) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum
                                   for v in values):
        raise ValueDomainError(f"{op}: {name} must be an int or a pair of ints >= {minimum}, got {value!r}")
    return int(values[0]), int(values[1])


def linear_rows(input: GraphTensor, weight: GraphTensor, bias: GraphTensor | None) -> GraphTensor:
    """F.linear(input, weight, bias) with input's leading dims flattened into one axis of rows first.

    The same values; the point is the backward: the weight gradient sums over every row, and over
    one (batch * sequence) axis that is a plain matrix product, where over (batch, sequence) it
    is a reduction whose index needs a division per element to split the merged position.
    """
    if input.ndim <= 2 or weight.ndim != 2:
        return linear(input, weight, bias)
    out = linear(input.reshape(-1, input.dims[-1]), weight, bias)
    return out.reshape(*input.dims[:-1], weight.dims[0])


class Linear(Module):
    """torch.nn.Linear: y = x W^T + b with weight (out_features, in_features) and bias (out_features,)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.in_features = positive_int("Linear", "in_features", in_features)
        self.out_features = positive_int("Linear", "out_features", out_features)
        rng, bound = init.generator(rng), init.fan_in_bound(in_features)
        self.weight = Parameter(init.uniform(rng, (out_features, in_features), bound))
        self.register_parameter("bias", init.uniform(rng, (out_features,), bound) if bias else None)

    def forward(self, input: GraphTensor) -> GraphTensor:
        return linear_rows(input, self.graph_tensor(input.graph, "weight"), self._optional_tensor(input.graph, "bias"))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """torch.nn.Conv2d (padding_mode "zeros"): weight (out, in / groups, kh, kw), bias (out,).

    padding is an int, a pair, "valid" or "same"; input (N, C, H, W) or (C, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.in_channels = positive_int("Conv2d", "in_channels", in_channels)
        self.out_channels = positive_int("Conv2d", "out_channels", out_channels)
        self.groups = positive_int("Conv2d", "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueDomainError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                                   f"divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise UnsupportedError(f"Conv2d: padding_mode {padding_mode!r} is not supported (only 'zeros')")
        self.kernel_size = pair("Conv2d", "kernel_size", kernel_size, 1)
        self.stride, self.dilation = pair("Conv2d", "stride", stride, 1), pair("Conv2d", "dilation", dilation, 1)
        self.padding = padding if isinstance(padding, str) else pair("Conv2d", "padding", padding, 0)
        self.padding_mode = padding_mode
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        rng, bound = init.generator(rng), init.fan_in_bound(int(np.prod(shape[1:])))
        self.weight = Parameter(init.uniform(rng, shape, bound))
        self.register_parameter("bias", init.uniform(rng, (out_channels,), bound) if bias else None)

    def forward(self, input: GraphTensor) -> GraphTensor:
        graph = input.graph
        return conv2d(input, self.graph_tensor(graph, "weight"), self._optional_tensor(graph, "bias"),
                      self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, bias={self.bias is not None}")


class Embedding(Module):
    """torch.nn.Embedding: rows of weight (num_embeddings, embedding_dim) at integer ids (int32 or float).

    padding_idx's row starts at zero. Deviations: torch also stops that row's gradient (here it
    is trained like the others); max_norm is unsupported; out-of-range ids give zero rows.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm=None, norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.num_embeddings = positive_int("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = positive_int("Embedding", "embedding_dim", embedding_dim)
        if max_norm is not None:
            raise UnsupportedError("Embedding: max_norm is not supported (it renormalizes the weight in place)")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueDomainError(f"Embedding: padding_idx must be within num_embeddings ({num_embeddings}), "
                                       f"got {padding_idx}")
            padding_idx %= num_embeddings
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        weight = init.normal(init.generator(rng), (num_embeddings, embedding_dim))
        if padding_idx is not None:
            weight[padding_idx] = 0.0
        self.weight = Parameter(weight)

    def forward(self, input: GraphTensor) -> GraphTensor:
        return embedding(input, self.graph_tensor(input.graph, "weight"))

    def extra_repr(self) -> str:
        extra = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{extra}"


# -- stateless wrappers --------------------------------------------------------------------------------
class Identity(Module):
    """torch.nn.Identity: returns its input (constructor arguments are accepted and ignored)."""

    def __init__(self, *args, prefix: str = "", **kwargs):
        super().__init__(prefix=prefix)

    def forward(self, input):
        return input


class ReLU(Module):
    """torch.nn.ReLU (inplace is accepted and ignored: graphs have no in-place ops)."""

    def __init__(self, inplace: bool = False, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.inplace = inplace

    def forward(self, input):
        return relu(input)


class GELU(Module):
    """torch.nn.GELU(approximate="none" | "tanh")."""

    def __init__(self, approximate: str = "none", *, prefix: str = ""):
        super().__init__(prefix=prefix)
        if approximate not in ("none", "tanh"):
            raise ValueDomainError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return gelu(input, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    """torch.nn.Sigmoid."""

    def forward(self, input):
        return sigmoid(input)


class Tanh(Module):
    """torch.nn.Tanh."""

    def forward(self, input):
        return tanh(input)


class SiLU(Module):
    """torch.nn.SiLU (inplace is accepted and ignored)."""

    def __init__(self, inplace: bool = False, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.inplace = inplace

    def forward(self, input):
        return silu(input)


class Flatten(Module):
    """torch.nn.Flatten(start_dim=1, end_dim=-1)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class MaxPool2d(Module):
    """torch.nn.MaxPool2d (return_indices is unsupported)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        if return_indices:
            raise UnsupportedError("MaxPool2d: return_indices=True is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        if isinstance(input, GraphTensor) and input.ndim not in (3, 4):
            raise ShapeError(f"MaxPool2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, "
                             f"got shape {show_shape(input.dims)}")
        return max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")
