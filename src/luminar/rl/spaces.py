"""Action spaces of the graph environments, and the checks of actions given from outside a graph.

Inside a graph an action is a float32 tensor: a discrete action is one number per environment
holding an integer in [0, n) (shape (N,)), a continuous one a vector per environment (shape
(N, size)). Arrays a caller passes to a compiled environment (VectorEnv) are checked here, with
luminar errors that name the environment (the row) at fault.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ShapeError, ValueDomainError


@dataclass(frozen=True)
class Discrete:
    """Actions 0, 1, ..., n - 1 (gymnasium.spaces.Discrete(n))."""
    n: int

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def check(self, actions, num_envs: int, where: str) -> np.ndarray:
        """`actions` as float32 (num_envs,), or a luminar error naming the first bad one."""
        array = _numeric(actions, where)
        if array.shape != (num_envs,):
            raise ShapeError(f"{where}: expected one discrete action per environment, shape ({num_envs},), "
                             f"got {array.shape}")
        bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)) | (array < 0) | (array >= self.n))
        if bad.size:
            raise ValueDomainError(f"{where}: action of environment {bad[0]} is {float(array[bad[0]])}; "
                                   f"actions are integers in [0, {self.n})")
        return array.astype(np.float32)


@dataclass(frozen=True)
class Box:
    """Real vectors with per-component bounds (gymnasium.spaces.Box(low, high, (size,)))."""
    low: float
    high: float
    size: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.size,)

    def check(self, actions, num_envs: int, where: str) -> np.ndarray:
        """`actions` as float32 (num_envs, size); values outside [low, high] are refused (gymnasium's
        Pendulum clips them silently; a caller that wants that clips first)."""
        array = _numeric(actions, where)
        if array.shape != (num_envs, self.size):
            raise ShapeError(f"{where}: expected actions of shape ({num_envs}, {self.size}), got {array.shape}")
        bad = np.flatnonzero(~(np.isfinite(array) & (array >= self.low) & (array <= self.high)).all(axis=1))
        if bad.size:
            raise ValueDomainError(f"{where}: action of environment {bad[0]} is {array[bad[0]].tolist()}; "
                                   f"actions lie in [{self.low}, {self.high}]")
        return array.astype(np.float32)


ActionSpace = Discrete | Box


def _numeric(actions, where: str) -> np.ndarray:
    array = np.asarray(actions)
    if array.dtype.kind not in "biuf":
        raise DTypeError(f"{where}: actions must be numbers, got dtype {array.dtype}")
    return array.astype(np.float64)
