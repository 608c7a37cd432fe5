"""Parameter initialization with PyTorch's default distributions, drawn from an explicit numpy Generator.

Every module constructor takes ``rng``: a ``numpy.random.Generator``, an int seed, or None for
fresh OS entropy (like an unseeded torch). Pass one Generator to all the modules of a model to make
the whole model reproducible. The values differ from torch's (a different random stream); the
distributions are the same.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ValueDomainError


def generator(rng) -> np.random.Generator:
    """`rng` as a Generator: a Generator itself, an int seed, or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise ValueDomainError(f"rng must be a numpy Generator, an int seed or None, got {type(rng).__name__}")


def uniform(rng: np.random.Generator, shape, bound: float) -> np.ndarray:
    """U(-bound, bound) as float32."""
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def fan_in_bound(fan_in: int) -> float:
    """PyTorch's default for Linear/Conv weights and biases: kaiming_uniform(a=sqrt(5)) has bound
    gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), which is 1 / sqrt(fan_in)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def xavier_uniform(rng: np.random.Generator, shape) -> np.ndarray:
    """torch.nn.init.xavier_uniform_ (gain 1) for a 2-D (fan_out, fan_in) weight: U(+-sqrt(6 / (fan_in + fan_out)))."""
    fan_out, fan_in = shape
    return uniform(rng, shape, math.sqrt(6.0 / (fan_in + fan_out)))


def normal(rng: np.random.Generator, shape) -> np.ndarray:
    """N(0, 1) as float32 (torch's Embedding default)."""
    return rng.standard_normal(size=shape).astype(np.float32)
