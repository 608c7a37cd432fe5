"""Dropout, with random numbers computed inside the graph from primitives.

A static graph has no random-number op, so each element's random number is a hash of its flat
index and a seed: a counter-based generator (like Philox, which torch uses on GPUs). The seed is
a 0-d graph input; the Dropout module keeps it as a buffer and increments it by 1 per program
call (``Graph.update``), so every training step draws a new mask and the same seed always draws
the same mask, on every backend.

The hash is exact in float32: all values are integers and every product stays below 2^24.
It is an 8-round Feistel network on pairs of residues modulo the prime P = 4093:

    lo, hi = i mod P, (i div P) mod P                 (i: the element's row-major flat index)
    a, b   = seed mod P, (seed div P) mod P            (the seed, an integer in [0, 2^24))
    e      = (i div P^2) mod P                         (only for tensors of P^2 = 16.7M elements or more)
    K_r    = (a m_r + b n_r + (e + 977 stream) o_r + c_r) mod P       for round r = 0..7
    L, R   = lo, hi;   each round:  L, R = R, (L + ((R + K_r) mod P)^2) mod P
    v      = L P + R,  uniform over [0, P^2) as i runs over P^2 consecutive indices

(`_ROUND_CONSTANTS` holds m_r, n_r, o_r, c_r; each product is reduced mod P before the sums.)
A Feistel network is a bijection for any round function, so within every block of P^2 indices
each v occurs exactly once; squaring mod P makes the rounds non-linear. An element is kept when
v >= round(p P^2), with probability 1 - p up to 1/P^2. ``stream`` separates several uses of one
seed in a graph (a Dropout module applied twice draws two masks).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError, ValueDomainError
from ..shape import index_vars, row_major_strides
from ..symbolic import sym
from ..tensor import GraphTensor
from . import init
from .module import Module

P = 4093  # a prime below 2^12: the product of two residues is below 2^24, exact in float32
SEED_LIMIT = 2 ** 24  # seeds are float32 integers: exact below 2^24
STREAM_STEP = 977
# per round: (m_r, n_r, o_r, c_r): multipliers of the seed's limbs and of the block/stream key, and a constant
_ROUND_CONSTANTS = ((1181, 2903, 3541, 17), (1949, 571, 2609, 1301), (3301, 1777, 307, 2711),
                    (739, 3919, 1453, 383), (2287, 1019, 3761, 3923), (421, 2591, 2039, 1097),
                    (3607, 1303, 883, 2237), (1627, 3187, 2459, 641))


def _mod_p_small(x: GraphTensor) -> GraphTensor:
    """x mod P for integers 0 <= x < 2P, with a comparison instead of an fmod."""
    return x - x.ge(float(P)) * float(P)


def _round_keys(seed: GraphTensor, stream: int) -> list[GraphTensor]:
    """The eight 0-d round keys K_r (without the per-element block term)."""
    a = seed.fmod(float(P))
    quotient = (seed - a) * (1.0 / P)  # an exact integer up to rounding: round it
    quotient = quotient + 0.5 - (quotient + 0.5).fmod(1.0)
    b = quotient.fmod(float(P))
    keys = []
    for m, n, o, c in _ROUND_CONSTANTS:
        constant = (c + (STREAM_STEP * stream % P) * o) % P
        keys.append(((a * float(m)).fmod(float(P)) + (b * float(n)).fmod(float(P)) + float(constant)).fmod(float(P)))
    return keys


def random_integers(like: GraphTensor, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """The hash v in [0, P^2) for every element of `like` (its shape only), as float32 integers."""
    flat = sym(0)
    for var, stride in zip(index_vars(like.dims), row_major_strides(like.dims)):
        flat = flat + var * stride
    numel = like.tracker.numel
    return hash_of_index(like.graph, flat, like.dims, seed, stream,
                         blocks=not (numel.is_const and numel.value <= P * P))


def hash_of_index(graph, flat, dims, seed: GraphTensor, stream: int, blocks: bool) -> GraphTensor:
    """The hash of the integer expression `flat` (over the index variables of `dims`).

    `blocks` adds the per-element key of the index's block of P^2 (needed when the index may
    reach P^2; without it every block would repeat the first block's numbers).
    """
    left, right = graph.constant(flat % P, dims), graph.constant((flat // P) % P, dims)
    keys = _round_keys(seed, stream)
    if blocks:
        block = graph.constant((flat // (P * P)) % P, dims)
        keys = [_mod_p_small(k + (block * float(o)).fmod(float(P))) for k, (_, _, o, _) in zip(keys, _ROUND_CONSTANTS)]
    for key in keys:
        mixed = _mod_p_small(right + key)
        left, right = right, _mod_p_small(left + (mixed * mixed).fmod(float(P)))
    return left * float(P) + right


def keep_mask(like: GraphTensor, p: float, seed: GraphTensor, stream: int = 0) -> GraphTensor:
    """1.0 where an element is kept (probability 1 - p), 0.0 where it is dropped."""
    threshold = round(p * P * P)
    return random_integers(like, seed, stream).ge(float(threshold))


def _check_p(op: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueDomainError(f"{op}: dropout probability has to be between 0 and 1, but got {p!r}")
    return float(p)


def _seed_tensor(op: str, input: GraphTensor, seed) -> GraphTensor:
    if isinstance(seed, GraphTensor):
        if seed.ndim != 0:
            raise ShapeError(f"{op}: seed must be a 0-d tensor, got shape {seed.shape}")
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed < SEED_LIMIT:
        return input.graph.constant(float(seed))
    raise ValueDomainError(f"{op}: seed must be a 0-d GraphTensor or an int in [0, 2^24), got {seed!r}")


def dropout(input: GraphTensor, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            seed=None, stream: int = 0) -> GraphTensor:
    """F.dropout: zero each element with probability p and scale the rest by 1 / (1 - p).

    Deviation: the random numbers come from `seed` (a 0-d GraphTensor holding an integer in
    [0, 2^24), or an int), not from a global generator; see the module docstring. `inplace`
    is accepted and ignored (graphs have no in-place ops). p = 1 gives input * 0, as in torch.
    """
    p = _check_p("dropout", p)
    if not isinstance(input, GraphTensor):
        raise UnsupportedError(f"dropout: input must be a GraphTensor, got {type(input).__name__}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    if seed is None:
        raise ValueDomainError("dropout: training needs a seed (a 0-d GraphTensor or an int); "
                               "nn.Dropout keeps one as state")
    mask = keep_mask(input, p, _seed_tensor("dropout", input, seed), stream)
    return input * (mask * (1.0 / (1.0 - p)))


class Dropout(Module):
    """torch.nn.Dropout(p, inplace). In training, each program call draws a new mask.

    The seed is a non-persistent buffer ``seed`` (left out of state_dict, as torch's RNG state
    is), drawn from `rng` unless given. Applying the module adds the graph input for it and an
    update seed -> seed + 1, so the n-th call of a compiled program uses seed + n - 1; after
    ``load_program_state`` the module continues from there. Seeds stay exact for 2^24 steps.
    """

    def __init__(self, p: float = 0.5, inplace: bool = False, *, seed: int | None = None, rng=None,
                 prefix: str = ""):
        super().__init__(prefix=prefix)
        self.p, self.inplace = _check_p("Dropout", p), inplace
        if seed is None:
            seed = int(init.generator(rng).integers(0, SEED_LIMIT // 2))
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < SEED_LIMIT:
            raise ValueDomainError(f"Dropout: seed must be an int in [0, 2^24), got {seed!r}")
        self.register_buffer("seed", np.float32(seed), persistent=False)

    def forward(self, input: GraphTensor) -> GraphTensor:
        if not self.training or self.p in (0.0, 1.0):
            return dropout(input, self.p, self.training)
        seed = self.graph_tensor(input.graph, "seed")
        application = self._application(input.graph)
        if application == 1:  # one step of the generator per program call, however often it is applied
            input.graph.update(seed, seed + 1.0)
        return dropout(input, self.p, True, seed=seed, stream=application - 1)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
