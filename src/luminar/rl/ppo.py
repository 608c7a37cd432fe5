"""PPO (Schulman et al. 2017) with CleanRL's formulation, every step a compiled luminar program.

One training iteration is:
  1. `steps / steps_per_call` calls of the rollout program (rollout.py): policy and
     environments together, environment states resident;
  2. one call of the GAE program (gae.py) over the whole rollout;
  3. `epochs * minibatches / minibatches_per_call` calls of the update program (update.py):
     each chains `minibatches_per_call` minibatch steps of the clipped surrogate objective, the
     (clipped) value loss and the entropy bonus, their gradients (luminar.grad), global-norm
     clipping and Adam, with parameters and Adam's moments resident in it. The minibatches are
     rows of the rollout in the order of a numpy permutation (the only work outside the
     programs, besides logging).
After the update the rollout program reads the new parameter arrays (the same arrays, no copy).

    ppo = PPO("CartPole-v1", PPOConfig(num_envs=8, steps=128))
    for stats in ppo.train(iterations=100):
        print(stats.iteration, stats.mean_return)
    ppo.evaluate(episodes=100)    # mean return of the deterministic policy
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ValueDomainError
from .registry import make
from .env import Env
from .gae import gae_program
from .policy import Policy
from .rollout import Batch, Rollout
from .update import MinibatchUpdates


@dataclass(frozen=True)
class PPOConfig:
    """CleanRL's ppo.py defaults unless noted (its CartPole configuration)."""
    num_envs: int = 4
    steps: int = 128                 # per environment per iteration (CleanRL's num_steps)
    steps_per_call: int = 8          # rollout steps unrolled in one compiled call
    gamma: float = 0.99
    gae_lambda: float = 0.95
    minibatches: int = 4
    minibatches_per_call: int = 4    # minibatch steps chained in one update call (not a CleanRL setting)
    epochs: int = 4
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    clip_coef: float = 0.2
    clip_value_loss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    reward_scale: float = 1.0        # rewards are multiplied by this before GAE (not in CleanRL's ppo.py)
    hidden: tuple[int, ...] = (64, 64)
    total_steps: int = 500_000       # sets the learning-rate annealing horizon
    seed: int = 1

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.minibatches

    @property
    def iterations(self) -> int:
        return max(self.total_steps // self.batch_size, 1)

    def check(self) -> None:
        for name in ("num_envs", "steps", "steps_per_call", "minibatches", "minibatches_per_call", "epochs",
                     "total_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueDomainError(f"PPOConfig: {name} must be an int >= 1, got {value!r}")
        if self.steps % self.steps_per_call:
            raise ValueDomainError(f"PPOConfig: steps ({self.steps}) must be a multiple of steps_per_call "
                                   f"({self.steps_per_call})")
        if self.batch_size % self.minibatches:
            raise ValueDomainError(f"PPOConfig: num_envs * steps ({self.batch_size}) must split into "
                                   f"{self.minibatches} equal minibatches")
        if self.minibatches % self.minibatches_per_call:
            raise ValueDomainError(f"PPOConfig: minibatches_per_call ({self.minibatches_per_call}) must divide "
                                   f"minibatches ({self.minibatches})")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueDomainError(f"PPOConfig: {name} must lie in [0, 1], got {getattr(self, name)!r}")


@dataclass
class IterationStats:
    iteration: int
    env_steps: int                   # environment steps so far
    seconds: float                   # wall-clock since training started (compiles excluded)
    episode_returns: np.ndarray      # the episodes that ended in this iteration
    losses: list[float] = field(default_factory=list)

    @property
    def mean_return(self) -> float:
        return float(self.episode_returns.mean()) if self.episode_returns.size else float("nan")


class PPO:
    """Compiles the rollout, GAE and update programs for `env` (an Env or a registered name)."""

    def __init__(self, env: Env | str, config: PPOConfig = PPOConfig(), backend: str = "cpu"):
        config.check()
        self.env = make(env) if isinstance(env, str) else env
        self.config, self.backend = config, backend
        self.policy = Policy(self.env.observation_size, self.env.action_space, config.hidden)
        started = time.perf_counter()
        self.rollout = Rollout(self.env, self.policy, config.num_envs, config.steps_per_call, seed=config.seed,
                               backend=backend)
        self.gae = gae_program(config.steps, config.num_envs, config.gamma, config.gae_lambda, config.reward_scale, backend)
        self.update = MinibatchUpdates(self.policy, config, self.policy.initial_params(config.seed),
                                       config.minibatches_per_call, backend)
        self.compile_seconds = time.perf_counter() - started
        self.rollout.load_params(self.update.params())
        self.iteration = 0
        self._shuffle = np.random.default_rng(config.seed)

    # -- training ----------------------------------------------------------------------------------
    def train_iteration(self) -> tuple[Batch, list[float]]:
        """One PPO iteration: rollout, GAE, epochs of minibatch updates. Returns the rollout and
        the minibatch losses."""
        c = self.config
        batch = self.rollout.collect(c.steps)
        out = self.gae(reward=batch.reward, value=batch.value, done=batch.done, next_value=batch.next_value)
        flat = {"obs": batch.obs.reshape(c.batch_size, -1),
                "action": batch.action.reshape(c.batch_size, *self.policy.action_space.shape),
                "old_logprob": batch.logprob.reshape(-1), "advantage": out["advantages"].reshape(-1),
                "returns": out["returns"].reshape(-1), "old_value": batch.value.reshape(-1)}
        lr = self.learning_rate()
        rows_per_call = c.minibatch_size * c.minibatches_per_call
        losses = []
        for _ in range(c.epochs):
            order = self._shuffle.permutation(c.batch_size)
            for start in range(0, c.batch_size, rows_per_call):
                rows = order[start:start + rows_per_call]
                losses += self.update.run({name: array[rows] for name, array in flat.items()}, lr).tolist()
        self.rollout.load_params(self.update.params())
        self.iteration += 1
        return batch, losses

    def learning_rate(self) -> float:
        """This iteration's learning rate: CleanRL anneals it linearly to 0 over config.iterations."""
        c = self.config
        if not c.anneal_lr:
            return c.learning_rate
        return c.learning_rate * max(1.0 - self.iteration / c.iterations, 0.0)

    def train(self, iterations: int | None = None):
        """Yield IterationStats after each of `iterations` iterations (default: the config's
        total_steps worth)."""
        iterations = self.config.iterations if iterations is None else iterations
        started = time.perf_counter()
        for _ in range(iterations):
            batch, losses = self.train_iteration()
            returns, _ = batch.episodes()
            yield IterationStats(self.iteration, self.iteration * self.config.batch_size,
                                 time.perf_counter() - started, returns, losses)

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(self, episodes: int = 100, seed: int = 12345) -> float:
        """Mean return of the deterministic policy (argmax / mean action) over `episodes` episodes:
        the first episode of each of `episodes` fresh environments, in the rollout program."""
        return float(self.rollout.evaluate(episodes, seed).mean())

    def params(self) -> dict[str, np.ndarray]:
        return self.update.params()
