"""Uniform and normal random numbers inside a graph, from the counter-based hash that Dropout uses.

A static graph has no random op: each element's number is a hash of its flat index and a seed
(luminar.nn.dropout's Feistel network over residues mod P = 4093, exact in float32). The seed
may be a 0-d tensor (one counter for the whole draw) or a tensor that broadcasts against the
draw's leading axis, e.g. shape (N, 1) for one counter per environment: the hash is elementwise
in the seed. `stream` separates several draws from one seed in a graph.
"""
from __future__ import annotations

import math

from ..nn.dropout import P, random_integers
from ..tensor import GraphTensor

RESOLUTION = float(P * P)  # the hash is uniform over the integers [0, P^2): 16.7M values


def uniform(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """Numbers in (0, 1), one per element of `like` (its shape only): (v + 1/2) / P^2, so that
    neither 0 nor 1 occurs (log(u) stays finite)."""
    return (random_integers(like, seed, stream) + 0.5) * (1.0 / RESOLUTION)


def normal(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """Standard normal numbers (Box-Muller on two independent uniforms from streams 2s, 2s + 1)."""
    radius = ((uniform(like, seed, 2 * stream).log() * -2.0)).sqrt()
    angle = uniform(like, seed, 2 * stream + 1) * (2.0 * math.pi)
    return radius * angle.sin()
