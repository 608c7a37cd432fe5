"""VectorEnv: a graph environment compiled once and stepped from numpy, with checked inputs.

    envs = VectorEnv("CartPole-v1", num_envs=1024, seed=0)
    obs = envs.observations()                         # (1024, 4)
    obs, reward, terminated, truncated = envs.step(actions)

The environment states stay in the program between calls (an input the graph updates); the
number of environments is a symbolic dim, so `reset(num_envs=...)` changes it without
recompiling. `step` returns the observation each environment reached (the final one where its
episode ended, gymnasium's `final_obs`); those environments are already reset inside the graph,
and `observations()` gives what the policy sees next.

Bad input is refused before anything runs, and the states are left as they were:
- actions of the wrong shape or dtype (ShapeError, DTypeError), of another number of
  environments than the state holds (ShapeError), or out of range (ValueDomainError naming the
  environment): discrete actions must be integers in [0, n), continuous ones lie in the Box
  (gymnasium's Pendulum clips silently; clip first to get that);
- states given to `reset(state=...)` of the wrong shape, or non-finite (ValueDomainError);
- a step whose observation comes out non-finite raises ValueDomainError naming the
  environments, and the step is undone (the classic-control dynamics cannot produce one from
  finite states; this guards states set by hand and other environments).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, ValueDomainError
from ..graph import Graph
from .registry import make
from .env import Env


class VectorEnv:
    def __init__(self, env: Env | str, num_envs: int, seed: int = 0, backend: str = "cpu", **compile_options):
        self.env = make(env) if isinstance(env, str) else env
        graph = Graph()
        state = graph.tensor("state", ("n", self.env.state_size))
        action = graph.tensor("action", ("n", *self.env.action_space.shape))
        result = self.env.step(state, action)
        for name in ("obs", "reward", "terminated", "truncated"):
            getattr(result, name).output(name)
        self.env.observe(result.state).output("next_obs")
        graph.update(state, result.state)
        self.program = graph.compile(backend, **compile_options)
        observe = Graph()
        self.env.observe(observe.tensor("state", ("n", self.env.state_size))).output("obs")
        self._observe = observe.compile(backend, **compile_options)
        self.reset(num_envs=num_envs, seed=seed)

    @property
    def num_envs(self) -> int:
        return self.state.shape[0]

    @property
    def state(self) -> np.ndarray:
        """The current states (num_envs, state_size): physics, episode step count, counter."""
        return self.program.state["state"]

    def reset(self, *, num_envs: int | None = None, seed: int = 0, state=None) -> np.ndarray:
        """Start over: fresh episodes for `num_envs` environments (default: as many as now) from
        `seed`, or the given `state` array. Returns the observations."""
        name = self.env.name
        if state is None:
            state = self.env.initial_state(self.num_envs if num_envs is None else num_envs, seed)
        state = np.array(state, np.float32)
        if state.ndim != 2 or state.shape[1] != self.env.state_size or state.shape[0] < 1:
            raise ShapeError(f"{name} VectorEnv.reset: state must have shape (N, {self.env.state_size}), "
                             f"got {state.shape}")
        bad = np.flatnonzero(~np.isfinite(state).all(axis=1))
        if bad.size:
            raise ValueDomainError(f"{name} VectorEnv.reset: the state of environment {bad[0]} is not finite: "
                                   f"{state[bad[0]].tolist()}")
        self.program.set_inputs(state=state)
        return self.observations()

    def observations(self) -> np.ndarray:
        """What each environment shows now (num_envs, observation_size)."""
        return self._observe(state=self.state)["obs"]

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(obs, reward, terminated, truncated) of one step of every environment; terminated and
        truncated are bool arrays."""
        where = f"{self.env.name} VectorEnv.step"
        actions = self.env.action_space.check(actions, self.num_envs, where)
        before = self.state
        out = self.program.run({"action": actions})
        bad = np.flatnonzero(~np.isfinite(out["obs"]).all(axis=1))
        if bad.size:
            self.program.set_inputs(state=before)
            raise ValueDomainError(f"{where}: non-finite observation {out['obs'][bad[0]].tolist()} of environment "
                                   f"{bad[0]} (of {bad.size} such); the step was undone")
        return out["obs"], out["reward"], out["terminated"] > 0, out["truncated"] > 0
