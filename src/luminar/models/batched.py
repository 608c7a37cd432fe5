"""The batched decode graph of a Llama-family model: one new token for each of `b` sequences.

Continuous batching (luminar.serve.engine) runs every running sequence's next token in one call
of this graph. Its inputs are

- ``tokens`` (b,) int32: each row's newest token
- ``seen``   (b,) int32: how many tokens row i's cache slot holds (its new token's position)
- ``k_slots`` / ``v_slots`` (t, w, layers, kv_heads, head_dim): the slotted KV cache, position-major
  with one column per sequence slot, so the prefix ``buffer[:t]`` of one preallocated buffer is
  passed without a copy. Rows 0..b-1 are the running sequences (the engine keeps them dense);
  the graph reads only those columns (a view, no copy). Slot position 0 is the dummy that
  attention masks out, as in KVCache: row i's keys are at positions 1..seen[i]; t is one more
  than the longest row's.
- ``inv_freq`` and the weights, shared by name with the prefill graph (models/llama.py).

Outputs: ``logits`` (b, vocab) and per layer ``k{l}`` / ``v{l}`` (b, kv_heads, head_dim), which the
engine writes into each row's slot at position seen[i] + 1.

Each row attends to its new key first, then to its slot's positions 0..t-1 with everything past
seen[i] masked: the keys a row sees are at the same places whatever t the longest row sets, so
a row's result does not depend on which other sequences share the call (the tests check greedy
generation batched against the same request alone). Sliding-window models are not batched.
"""
from __future__ import annotations

import math

import luminar as lm

from ..errors import UnsupportedError
from ..graph import Graph
from ..tensor import GraphTensor
from .llama import MASKED, LlamaConfig, Weights, _angles, _softcap, decoder_stack


# The shapes the search times the batched graph at: 8 rows of a 16-column slot buffer, 128 positions.
BATCH_SEARCH_DIMS = {"b": 8, "w": 16, "t": 128}


def build_batched_graph(config: LlamaConfig, weights: Weights) -> Graph:
    """The batched decode graph described in the module docstring."""
    c = config
    if c.has_sliding:
        raise UnsupportedError(f"{c.architecture}: continuous batching supports full-attention models only; "
                               f"this one has sliding-window layers")
    g = Graph()
    kv, hd, layers = c.num_key_value_heads, c.head_dim, c.num_hidden_layers
    tokens = g.tensor("tokens", ("b",), "int32")
    seen = g.tensor("seen", ("b",), "int32")
    k_slots = g.tensor("k_slots", ("t", "w", layers, kv, hd))
    v_slots = g.tensor("v_slots", ("t", "w", layers, kv, hd))
    b, t = tokens.dims[0], k_slots.dims[0]
    k_rows, v_rows = k_slots.narrow(1, 0, b), v_slots.narrow(1, 0, b)  # (t, b, layers, kv, hd)
    slot = g.arange(t)
    past = slot.ge(1.0) * slot.le(seen.unsqueeze(-1))  # (b, t): positions 1..seen[i] hold row i's keys
    visible = lm.cat([g.constant(1.0, (b, 1)), past], 1)  # (b, 1 + t): its own new key first
    rotation = _angles(g.tensor("inv_freq", (hd // 2,)), seen.unsqueeze(-1))  # the new token is at position seen

    def attend(layer, q, k, v):
        keys = lm.cat([k.unsqueeze(0), k_rows[:, :, layer]], 0)  # (1 + t, b, kv, hd)
        values = lm.cat([v.unsqueeze(0), v_rows[:, :, layer]], 0)
        return _row_attention(q, keys, values, visible, c)

    decoder_stack(g, c, weights, tokens, lambda layer: rotation, attend)
    return g


def _row_attention(q: GraphTensor, keys: GraphTensor, values: GraphTensor, visible: GraphTensor,
                   c: LlamaConfig) -> GraphTensor:
    """Grouped-query attention of one query per row: q (b, heads, d), keys/values (T, b, kv_heads, d),
    visible (b, T) 0/1. Returns (b, heads * d)."""
    b = q.dims[0]
    kv, groups, d = c.num_key_value_heads, c.groups, c.head_dim
    q = q.reshape(b, kv, groups, 1, d)
    scale = c.query_scale if c.query_scale is not None else 1.0 / math.sqrt(d)
    scores = (q @ keys.permute(1, 2, 3, 0).unsqueeze(2)) * scale  # (b, kv, groups, 1, T)
    if c.attn_softcap:
        scores = _softcap(scores, c.attn_softcap)
    mask = visible.reshape(b, 1, 1, 1, visible.dims[1])
    probs = scores.masked_fill(1.0 - mask, MASKED).softmax(-1)
    out = probs @ values.permute(1, 2, 0, 3).unsqueeze(2)  # (b, kv, groups, 1, d)
    return out.reshape(b, kv * groups * d)
