"""Uniform and normal random numbers inside a graph: a counter-based hash of (index, seed).

A static graph has no random op, so, as Dropout does (luminar.nn.dropout), each element's number
is a hash of its flat index and a seed: the same seed gives the same numbers on every backend,
and a counter fed as the seed gives new numbers each call. The hash here is built for speed on
the CPU target: every modulus is a power of two (4096), which the C renderer turns into an exact,
vectorized truncation, where Dropout's prime modulus costs a libm fmodf call per element (an
8-round draw over 1,024 x 4 elements took ~0.1 ms that way; the environments' resets draw every
step).

It is an 8-round Feistel network on two 12-bit halves, all values integers in float32 and every
product below 2^24 (exact):

    lo, hi = i mod 4096, (i div 4096) mod 4096,     i the element's row-major flat index
    a, b   = seed mod 4096, (seed div 4096) mod 4096   (seed an integer in [0, 2^24))
    K_r    = (a m_r mod 4096 + b n_r mod 4096 + c_r + 1031 stream) mod 4096
    L, R   = (lo + 2741 (i div 2^24)) mod 4096, hi;    each round:
    L, R   = R, (L + F((R + K_r) mod 4096)) mod 4096,   F(x) = (x^2 div 64) mod 4096 (middle square)
    v      = 4096 L + R

A Feistel network is a bijection of (lo, hi) whatever F is, so over 2^24 consecutive indices
each v in [0, 2^24) occurs exactly once; the middle-square F makes the rounds non-linear. The
seed may be 0-d (one counter for the draw) or broadcast against the draw, e.g. (N, 1) for one
counter per environment: the hash is elementwise in the seed. `stream` separates draws from
one seed in one graph. tests/test_rl.py checks uniformity and independence statistically.
"""
from __future__ import annotations

import math

from ..shape import index_vars, row_major_strides
from ..symbolic import sym
from ..tensor import GraphTensor

HALF = 4096  # each half of the Feistel block: 12 bits
BLOCK = HALF * HALF  # 2^24 values per hash
SEED_LIMIT = BLOCK  # seeds are float32 integers, exact below 2^24
# per round: multipliers of the seed's two limbs and a constant (odd, spread over [0, 4096))
_ROUNDS = ((2897, 1103, 3469), (1549, 3823, 607), (3187, 2357, 1879), (797, 3673, 2963),
           (2539, 199, 1301), (3919, 1627, 3701), (439, 2999, 1051), (1777, 2203, 3319))
_STREAM_STEP, _BLOCK_STEP = 1031, 2741


def _mod(x: GraphTensor) -> GraphTensor:
    return x.fmod(float(HALF))


def _div(x: GraphTensor) -> GraphTensor:
    """x div 4096 for an integer x >= 0 (exact: the remainder is exact, the scaling a power of 2)."""
    return (x - _mod(x)) * (1.0 / HALF)


def _round_function(x: GraphTensor) -> GraphTensor:
    square = x * x  # < 2^24
    return _mod((square - square.fmod(64.0)) * (1.0 / 64.0))


def random_integers(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """The hash v in [0, 2^24) of every element of `like` (its shape only), as float32 integers."""
    graph = like.graph
    flat = sym(0)
    for var, stride in zip(index_vars(like.dims), row_major_strides(like.dims)):
        flat = flat + var * stride
    left = graph.constant((flat % HALF + (flat // BLOCK) * _BLOCK_STEP) % HALF, like.dims)
    right = graph.constant((flat // HALF) % HALF, like.dims)
    a, b = _mod(seed), _mod(_div(seed))
    for m, n, c in _ROUNDS:
        key = _mod(_mod(a * float(m)) + _mod(b * float(n)) + float((c + _STREAM_STEP * stream) % HALF))
        left, right = right, _mod(left + _round_function(_mod(right + key)))
    return left * float(HALF) + right


def uniform(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """Numbers in (0, 1), one per element of `like`: (v + 1/2) / 2^24, so neither 0 nor 1 occurs
    (log(u) stays finite)."""
    return (random_integers(like, seed, stream) + 0.5) * (1.0 / BLOCK)


def normal(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """Standard normal numbers (Box-Muller on two independent uniforms, streams 2s and 2s + 1)."""
    radius = (uniform(like, seed, 2 * stream).log() * -2.0).sqrt()
    angle = uniform(like, seed, 2 * stream + 1) * (2.0 * math.pi)
    return radius * angle.sin()
