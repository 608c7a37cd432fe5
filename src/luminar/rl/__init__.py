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
from .policy import Policy
from .ppo import PPO, IterationStats, PPOConfig
from .registry import ENVIRONMENTS, make
from .rollout import Batch, Rollout
from .spaces import Box, Discrete
from .vector_env import VectorEnv

__all__ = ["Env", "StepResult", "Transition", "CartPole", "Acrobot", "MountainCar", "Pendulum", "Box", "Discrete",
           "ENVIRONMENTS", "make", "VectorEnv", "Policy", "Rollout", "Batch", "PPO", "PPOConfig", "IterationStats"]
