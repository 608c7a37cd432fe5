"""Environments as graph functions: one vectorized step of N environments, reset included.

An environment's state is one float32 tensor of shape (N, physics + 2): each row holds one
environment's physical state (gymnasium's `env.unwrapped.state`), then the number of steps of
its current episode (for the time limit, gymnasium's TimeLimit) and its random-number counter.
N is usually a symbolic dim, so one compiled program runs any number of environments.

    env = CartPole()
    g = lm.Graph()
    state, action = g.tensor("state", ("n", env.state_size)), g.tensor("action", ("n",))
    result = env.step(state, action)     # StepResult(state, obs, reward, terminated, truncated)

`step` follows gymnasium's Env.step exactly for obs, reward, terminated and truncated: `obs` is
the observation the transition reached (the final one where an episode ended). Reset happens
inside the graph in the same step: where an episode ended, `result.state` already holds a fresh
initial state, drawn from the environment's counter with the counter-based hash (rl.random),
and the counter advances by one. The next observation a policy sees is `env.observe(result.state)`.

A subclass gives the physics: `dynamics` (one transition), `observation`, `reset_physics` (the
initial distribution from uniforms in (0, 1)) and the constants below.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import ShapeError, ValueDomainError
from ..graph import Graph, show_shape
from ..library.indexing import cat, stack
from ..symbolic import sym
from ..tensor import GraphTensor
from .random import SEED_LIMIT, uniform
from .spaces import ActionSpace, Discrete

RESET_STREAM = 0  # rl.random stream of the reset draws; other draws in a graph with the environments use streams >= 1


class Transition(NamedTuple):
    """What the physics of one step gives, before the time limit and the reset."""
    physics: GraphTensor      # (N, physics_size)
    reward: GraphTensor       # (N,)
    terminated: GraphTensor   # (N,) 1.0 or 0.0


class StepResult(NamedTuple):
    state: GraphTensor        # (N, state_size): the next state, reset where the episode ended
    obs: GraphTensor          # (N, observation_size): the observation the step reached
    reward: GraphTensor       # (N,)
    terminated: GraphTensor   # (N,) 1.0 where the episode reached a terminal state
    truncated: GraphTensor    # (N,) 1.0 where it reached the time limit


def columns(physics: GraphTensor) -> list[GraphTensor]:
    """The physical state's components, each (N,)."""
    return [physics[:, k] for k in range(physics.dims[1].value)]


def rows(*components: GraphTensor) -> GraphTensor:
    """(N, k) from k tensors of shape (N,): the inverse of `columns`."""
    return stack(list(components), 1)


def between(uniforms: GraphTensor, low: float, high: float) -> GraphTensor:
    """Uniform numbers in (low, high) from uniforms in (0, 1) (numpy's uniform(low, high))."""
    return uniforms * (high - low) + low


class Env:
    """Base class of the graph environments (see the module docstring)."""

    name = ""
    physics_size = 0
    observation_size = 0
    max_episode_steps = 0
    action_space: ActionSpace = Discrete(1)

    @property
    def state_size(self) -> int:
        return self.physics_size + 2

    # -- what a subclass defines -------------------------------------------------------------------
    def dynamics(self, physics: GraphTensor, action: GraphTensor) -> Transition:
        raise NotImplementedError

    def observation(self, physics: GraphTensor) -> GraphTensor:
        raise NotImplementedError

    def reset_physics(self, uniforms: GraphTensor) -> GraphTensor:
        """The initial physical state from `uniforms` (N, physics_size), independent in (0, 1)."""
        raise NotImplementedError

    # -- the graph functions -----------------------------------------------------------------------
    def step(self, state: GraphTensor, action: GraphTensor) -> StepResult:
        """One step of every environment with `action` (see the module docstring)."""
        self._check_state(state, "step")
        self._check_action(state, action)
        physics, elapsed, counter = self._split(state)
        moved = self.dynamics(physics, action)
        elapsed = elapsed + 1.0
        truncated = elapsed.ge(float(self.max_episode_steps))
        done = 1.0 - (1.0 - moved.terminated) * (1.0 - truncated)
        fresh = self.reset(state)  # drawn for every row, kept where the episode ended
        kept = self._join(moved.physics, elapsed, counter)
        keep = (1.0 - done).unsqueeze(1)
        next_state = kept * keep + fresh * (1.0 - keep)
        return StepResult(next_state, self.observation(moved.physics), moved.reward, moved.terminated, truncated)

    def reset(self, state: GraphTensor) -> GraphTensor:
        """A fresh episode for every environment: new physics drawn from the counter, step count
        0, counter + 1."""
        self._check_state(state, "reset")
        _, elapsed, counter = self._split(state)
        like = state[:, :self.physics_size]
        physics = self.reset_physics(uniform(like, counter.unsqueeze(1), RESET_STREAM))
        return self._join(physics, elapsed * 0.0, counter + 1.0)

    def observe(self, state: GraphTensor) -> GraphTensor:
        """The observation of each environment's current state (N, observation_size)."""
        self._check_state(state, "observe")
        return self.observation(self._split(state)[0])

    def initial_state(self, num_envs: int, seed: int = 0) -> np.ndarray:
        """(num_envs, state_size) float32: the first episode of each environment. Environment i
        draws its episodes from counters seed, seed + 1, ... (its row index keeps the draws of
        different environments apart)."""
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueDomainError(f"{self.name}.initial_state: num_envs must be an int >= 1, got {num_envs!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < SEED_LIMIT // 2:
            raise ValueDomainError(f"{self.name}.initial_state: seed must be an int in [0, 2^23), got {seed!r}")
        graph = Graph()
        blank = graph.tensor("state", (int(num_envs), self.state_size))
        self.reset(blank).output("fresh")
        start = np.zeros((num_envs, self.state_size), np.float32)
        start[:, -1] = seed - 1  # reset advances the counter: the first episode uses `seed`
        return graph.compile("reference")(state=start)["fresh"]

    # -- helpers -----------------------------------------------------------------------------------
    def _split(self, state: GraphTensor) -> tuple[GraphTensor, GraphTensor, GraphTensor]:
        k = self.physics_size
        return state[:, :k], state[:, k], state[:, k + 1]

    @staticmethod
    def _join(physics: GraphTensor, elapsed: GraphTensor, counter: GraphTensor) -> GraphTensor:
        return cat([physics, elapsed.unsqueeze(1), counter.unsqueeze(1)], 1)

    def _check_state(self, state, op: str) -> None:
        if not isinstance(state, GraphTensor):
            raise ShapeError(f"{self.name}.{op}: state must be a GraphTensor, got {type(state).__name__}")
        if state.ndim != 2 or not state.dims[1].is_const or state.dims[1].value != self.state_size:
            raise ShapeError(f"{self.name}.{op}: state must have shape (N, {self.state_size}) "
                             f"({self.physics_size} physics values, step count, counter), got {show_shape(state.dims)}")

    def _check_action(self, state: GraphTensor, action) -> None:
        if not isinstance(action, GraphTensor):
            raise ShapeError(f"{self.name}.step: action must be a GraphTensor, got {type(action).__name__}")
        expected = (state.dims[0], *(sym(d) for d in self.action_space.shape))
        if tuple(map(str, action.dims)) != tuple(map(str, expected)):
            raise ShapeError(f"{self.name}.step: action must have shape {show_shape(expected)} (one per environment "
                             f"of the state {show_shape(state.dims)}), got {show_shape(action.dims)}")

