"""The graph environments by gymnasium id."""
from __future__ import annotations

from ..errors import UnsupportedError
from .acrobot import Acrobot
from .cartpole import CartPole
from .env import Env
from .mountain_car import MountainCar
from .pendulum import Pendulum

ENVIRONMENTS: dict[str, type[Env]] = {env.name: env for env in (CartPole, Acrobot, MountainCar, Pendulum)}


def make(name: str) -> Env:
    """The graph environment registered as `name` ("CartPole-v1", "Acrobot-v1", "MountainCar-v0",
    "Pendulum-v1")."""
    if name not in ENVIRONMENTS:
        raise UnsupportedError(f"luminar.rl.make: no environment {name!r}; available: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]()
