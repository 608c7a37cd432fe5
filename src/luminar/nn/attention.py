"""Multi-head attention and the transformer encoder layer, parameter-compatible with torch.nn.

State-dict names and shapes are torch's: MultiheadAttention has the packed ``in_proj_weight``
(3E, E) and ``in_proj_bias`` (3E,) plus ``out_proj.weight`` / ``out_proj.bias``;
TransformerEncoderLayer adds ``linear1``, ``linear2``, ``norm1``, ``norm2``. So a torch module's
state_dict loads into these.

Deviations from torch:
- masks are additive float tensors (0 where attention is allowed, a large negative number such as
  -1e30, or -inf, where it is not): a graph tensor has no bool dtype, so torch's boolean masks
  (True = masked) must be passed as ``mask * -1e30``;
- ``need_weights`` defaults to False (torch: True), so the usual call returns (output, None);
- ``is_causal=True`` without an ``attn_mask`` builds the causal mask in the graph (torch wants the
  mask as well and treats is_causal as a hint); with an attn_mask, the mask is used as given;
- kdim/vdim different from embed_dim, add_bias_kv and add_zero_attn are unsupported.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..graph import parse_dim, show_shape
from ..library.elementwise import gelu, relu
from ..library.reduce import softmax
from ..shape import index_var
from ..tensor import GraphTensor
from . import init
from .dropout import Dropout
from .layers import Linear, linear_rows, positive_int
from .module import Module, Parameter
from .norm import LayerNorm

MASKED = -1.0e30  # a finite "minus infinity" (graph constants must be finite)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, batch_first).

    forward(query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights or None). Inputs are
    (N, L, E) with batch_first, (L, N, E) without, or (L, E) unbatched. attn_mask is (L, S) or
    (N * num_heads, L, S); key_padding_mask is (N, S); both are added to the scores. Dropout
    (training mode) applies to the attention weights.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        self.embed_dim = positive_int("MultiheadAttention", "embed_dim", embed_dim)
        self.num_heads = positive_int("MultiheadAttention", "num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueDomainError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                                   f"({num_heads})")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise UnsupportedError("MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim other than "
                                   "embed_dim are not supported")
        self.head_dim, self.batch_first, self.dropout = embed_dim // num_heads, batch_first, dropout
        rng = init.generator(rng)
        # torch: xavier_uniform in_proj, zero in_proj bias, out_proj a Linear whose bias is zeroed
        self.in_proj_weight = Parameter(init.xavier_uniform(rng, (3 * embed_dim, embed_dim)))
        self.register_parameter("in_proj_bias", np.zeros(3 * embed_dim, np.float32) if bias else None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, rng=rng)
        if bias:
            self.out_proj.bias = self.out_proj.bias * 0.0
        self.attn_dropout = Dropout(dropout, rng=rng)  # its seed is not in state_dict: keys match torch

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = False, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        batched = self._check_inputs(query, key, value)
        self_attention = query is key and key is value
        q, k, v = (self._batch_first(t, batched) for t in (query, key, value))
        graph, (n, length, _) = query.graph, q.dims
        weight, bias = self.graph_tensor(graph, "in_proj_weight"), self._optional_tensor(graph, "in_proj_bias")
        e = self.embed_dim
        q, k, v = (self._heads(t) for t in self._in_projection(q, k, v, weight, bias, self_attention))
        scores = (q @ k.mT) * (1.0 / math.sqrt(self.head_dim))  # (N, H, L, S)
        scores = self._masked(scores, attn_mask, key_padding_mask, is_causal, batched)
        probs = self.attn_dropout(softmax(scores, -1))
        out = (probs @ v).permute(0, 2, 1, 3).reshape(n, length, e)  # heads back together: (N, L, E)
        out = self.out_proj(out)
        out = out if not batched else out if self.batch_first else out.transpose(0, 1)
        if not batched:
            out = out.squeeze(0)
        weights = None
        if need_weights:
            weights = probs.mean(1) if average_attn_weights else probs
            weights = weights if batched else weights.squeeze(0)
        return out, weights

    def _check_inputs(self, query, key, value) -> bool:
        tensors = (query, key, value)
        if not all(isinstance(t, GraphTensor) for t in tensors):
            raise UnsupportedError("MultiheadAttention: query, key and value must be GraphTensors")
        ranks = {t.ndim for t in tensors}
        if len(ranks) != 1 or ranks.pop() not in (2, 3):
            raise ShapeError(f"MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D "
                             f"(unbatched), got shapes {', '.join(show_shape(t.dims) for t in tensors)}")
        for name, t in zip(("query", "key", "value"), tensors):
            if t.dims[-1] != parse_dim(self.embed_dim):
                raise ShapeError(f"MultiheadAttention: {name} must have embed_dim={self.embed_dim} features "
                                 f"(last dim), got shape {show_shape(t.dims)}")
        if key.dims[:-1] != value.dims[:-1]:
            raise ShapeError(f"MultiheadAttention: key and value must have the same shape but the last dim, "
                             f"got {show_shape(key.dims)} and {show_shape(value.dims)}")
        return query.ndim == 3

    def _in_projection(self, q, k, v, weight, bias, self_attention: bool) -> list[GraphTensor]:
        """q, k, v through their thirds of the packed in-projection. Self-attention (one tensor for
        all three) projects once with the whole (3E, E) weight and splits the result: one matmul
        forward, and in the backward the three gradients meet in one (L, 3E) buffer, so the input
        and weight gradients are one matmul each instead of three summed side by side."""
        e = self.embed_dim
        if self_attention:
            packed = linear_rows(q, weight, bias)
            return [packed[..., i * e:(i + 1) * e] for i in range(3)]
        return [linear_rows(t, weight[i * e:(i + 1) * e], None if bias is None else bias[i * e:(i + 1) * e])
                for i, t in enumerate((q, k, v))]

    def _batch_first(self, t: GraphTensor, batched: bool) -> GraphTensor:
        if not batched:
            return t.unsqueeze(0)
        return t if self.batch_first else t.transpose(0, 1)

    def _heads(self, t: GraphTensor) -> GraphTensor:
        """(N, L, E) -> (N, H, L, D)."""
        n, length, _ = t.dims
        return t.reshape(n, length, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def _masked(self, scores, attn_mask, key_padding_mask, is_causal: bool, batched: bool):
        n, heads, length, source = scores.dims
        if attn_mask is not None:
            if attn_mask.ndim == 3:  # (N * H, L, S) in torch's order: batch-major
                expected = (n * heads if batched else heads, length, source)
                if tuple(attn_mask.dims) != tuple(parse_dim(d) for d in expected):
                    raise ShapeError(f"MultiheadAttention: attn_mask must be (L, S) or (N * num_heads, L, S) = "
                                     f"{show_shape(expected)}, got {show_shape(attn_mask.dims)}")
                attn_mask = attn_mask.reshape(n, heads, length, source)
            elif attn_mask.ndim != 2 or tuple(attn_mask.dims) != (length, source):
                raise ShapeError(f"MultiheadAttention: attn_mask must be (L, S) = {show_shape((length, source))} or "
                                 f"(N * num_heads, L, S), got {show_shape(attn_mask.dims)}")
            scores = scores + attn_mask
        elif is_causal:
            row, column = index_var(0, length), index_var(1, source)
            future = scores.graph.constant(column.gt(row), (length, source))
            scores = scores.masked_fill(future, MASKED)
        if key_padding_mask is not None:
            expected = (n, source) if batched else (source,)
            if tuple(key_padding_mask.dims) != tuple(expected):
                raise ShapeError(f"MultiheadAttention: key_padding_mask must be {show_shape(expected)} (batch, "
                                 f"source length), got {show_shape(key_padding_mask.dims)}")
            scores = scores + key_padding_mask.reshape(n, 1, 1, source)
        return scores

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each residual.

    norm_first=False (torch's default): x = norm1(x + sa(x)); x = norm2(x + ff(x)).
    norm_first=True: x = x + sa(norm1(x)); x = x + ff(norm2(x)). ff is
    linear2(dropout(activation(linear1(x)))); dropout1/dropout2 follow the two blocks.
    activation is "relu", "gelu" or a callable on GraphTensors. forward(src, src_mask=None,
    src_key_padding_mask=None, is_causal=False) with masks as in MultiheadAttention.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        rng = init.generator(rng)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            rng=rng)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, rng=rng)
        self.dropout = Dropout(dropout, rng=rng)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, rng=rng)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout, rng=rng)
        self.dropout2 = Dropout(dropout, rng=rng)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueDomainError(f"TransformerEncoderLayer: activation should be 'relu' or 'gelu' or a "
                                       f"callable, not {activation!r}")
            activation = _ACTIVATIONS[activation]
        elif not callable(activation):
            raise ValueDomainError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable, "
                                   f"got {activation!r}")
        self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._self_attention(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward(x))

    def _self_attention(self, x, attn_mask, key_padding_mask, is_causal):
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _feed_forward(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
