"""Normalization layers: BatchNorm2d (batch statistics as graph state) and LayerNorm."""
from __future__ import annotations

import numpy as np

from ..errors import InputError, ShapeError, UnsupportedError, ValueDomainError
from ..graph import parse_dim, show_shape
from ..library.nn_ops import layer_norm
from ..tensor import GraphTensor
from .layers import positive_int
from .module import Module


class BatchNorm2d(Module):
    """torch.nn.BatchNorm2d over (N, C, H, W): per-channel normalization.

    Training (or track_running_stats=False): normalize with the batch's mean and biased variance
    over (N, H, W). In training with tracked statistics, the graph also updates its state
    (Graph.update): running_mean and running_var move toward the batch mean and the *unbiased*
    variance by `momentum` (momentum=None: a cumulative average over num_batches_tracked), and
    num_batches_tracked grows by 1, as torch does. Evaluation: normalize with the running
    statistics. The batch dims may be symbolic.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.num_features = positive_int("BatchNorm2d", "num_features", num_features)
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueDomainError(f"BatchNorm2d: momentum must be in [0, 1] or None, got {momentum}")
        self.eps, self.momentum, self.affine, self.track_running_stats = eps, momentum, affine, track_running_stats
        self.register_parameter("weight", np.ones(num_features, np.float32) if affine else None)
        self.register_parameter("bias", np.zeros(num_features, np.float32) if affine else None)
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, np.float32))
            self.register_buffer("running_var", np.ones(num_features, np.float32))
            self.register_buffer("num_batches_tracked", np.float32(0))

    def forward(self, input: GraphTensor) -> GraphTensor:
        self._check_input(input)
        graph, channels = input.graph, (1, self.num_features, 1, 1)
        if self.training or not self.track_running_stats:
            mean = input.mean((0, 2, 3), keepdim=True)
            centered = input - mean
            variance = (centered * centered).mean((0, 2, 3), keepdim=True)
            if self.training and self.track_running_stats:
                self._update_running_stats(input, mean.reshape(-1), variance.reshape(-1))
        else:
            centered = input - self.graph_tensor(graph, "running_mean").reshape(channels)
            variance = self.graph_tensor(graph, "running_var").reshape(channels)
        out = centered * (variance + self.eps).sqrt().reciprocal()
        if self.affine:
            out = out * self.graph_tensor(graph, "weight").reshape(channels) + \
                self.graph_tensor(graph, "bias").reshape(channels)
        return out

    def _check_input(self, input):
        if not isinstance(input, GraphTensor) or input.ndim != 4:
            got = f"{input.ndim}D input with shape {show_shape(input.dims)}" if isinstance(input, GraphTensor) \
                else type(input).__name__
            raise ShapeError(f"BatchNorm2d: expected 4D input (N, C, H, W), got {got}")
        if input.dims[1] != parse_dim(self.num_features):
            raise ShapeError(f"BatchNorm2d: expected {self.num_features} channels (dim 1), got input of shape "
                             f"{show_shape(input.dims)}")

    def _update_running_stats(self, input, batch_mean, batch_variance):
        graph = input.graph
        running_mean = self.graph_tensor(graph, "running_mean")
        running_var = self.graph_tensor(graph, "running_var")
        count_tensor = self.graph_tensor(graph, "num_batches_tracked")
        n = input.dims[0] * input.dims[2] * input.dims[3]  # values per channel, possibly symbolic
        if n.is_const and n.value <= 1:
            raise ShapeError(f"BatchNorm2d: expected more than 1 value per channel when training, got input of "
                             f"shape {show_shape(input.dims)}")
        bessel = n.value / (n.value - 1) if n.is_const else graph.constant(n) / graph.constant(n - 1)
        unbiased = batch_variance * bessel
        count = count_tensor + 1.0
        factor = count.reciprocal() if self.momentum is None else self.momentum
        try:
            graph.update(count_tensor, count)
            graph.update(running_mean, running_mean * (1.0 - factor) + batch_mean * factor)
            graph.update(running_var, running_var * (1.0 - factor) + unbiased * factor)
        except InputError:
            raise UnsupportedError("BatchNorm2d: a module in training mode can update its running statistics once "
                                   "per graph; it was applied twice in the same graph") from None

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class LayerNorm(Module):
    """torch.nn.LayerNorm over the trailing `normalized_shape` dims (weight ones, bias zeros)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 *, prefix: str = ""):
        super().__init__(prefix=prefix)
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
        self.normalized_shape = tuple(positive_int("LayerNorm", "normalized_shape", d) for d in shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        affine_bias = elementwise_affine and bias
        self.register_parameter("weight", np.ones(self.normalized_shape, np.float32) if elementwise_affine else None)
        self.register_parameter("bias", np.zeros(self.normalized_shape, np.float32) if affine_bias else None)

    def forward(self, input: GraphTensor) -> GraphTensor:
        graph = input.graph
        return layer_norm(input, self.normalized_shape, self._optional_tensor(graph, "weight"),
                          self._optional_tensor(graph, "bias"), self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

