"""luminar.rl: reinforcement learning inside the graph.

Environments are graph functions (env.py: `step(state, action) -> StepResult`, vectorized over
a symbolic number of environments, reset inside the graph); `VectorEnv` compiles one for use
from numpy; `PPO` trains a policy with rollouts, GAE and the clipped-objective update all in
compiled programs whose parameters, optimizer and environment states stay resident.
"""
from .acrobot import Acrobot
from .cartpole import CartPole
from .env import Env, StepResult, Transition
from .mountain_car import MountainCar
from .pendulum import Pendulum
from .spaces import Box, Discrete

ENVIRONMENTS = {env.name: env for env in (CartPole, Acrobot, MountainCar, Pendulum)}


def make(name: str) -> Env:
    """The graph environment registered as `name` ("CartPole-v1", "Acrobot-v1", "MountainCar-v0",
    "Pendulum-v1")."""
    from ..errors import UnsupportedError
    if name not in ENVIRONMENTS:
        raise UnsupportedError(f"luminar.rl.make: no environment {name!r}; available: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]()


__all__ = ["Env", "StepResult", "Transition", "CartPole", "Acrobot", "MountainCar", "Pendulum", "Box", "Discrete",
           "ENVIRONMENTS", "make"]
