"""The rollout program: K steps of N environments with the policy, one compiled call.

One call runs, K times: observe the state, evaluate actor and critic, sample an action with the
counter-based hash, step every environment (reset in the graph where an episode ends). The
environment states, each environment's running episode return and length, and the sampling
seed are inputs the graph updates (`Graph.update`), so they stay in the program between calls;
the parameters are set from the learner after each update (the same arrays, not copies).

Why K steps per call, called T / K times, rather than one graph of all T steps: the graph of
one step is ~1,000 primitive nodes, and compile time grows with the graph (about linearly:
kernels are generated, and C compiled, per copy). A program of K steps compiles in a time set
by K alone, whatever T is; K amortises the per-call cost (~0.1 ms of Python per call) over K
steps. `compile_seconds` records what it cost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import ValueDomainError
from ..graph import Graph
from ..library.indexing import stack
from .env import Env
from .policy import Policy

RECORDS = ("obs", "action", "logprob", "value", "reward", "done", "finished_return", "finished_length")


@dataclass
class Batch:
    """T steps of N environments, each field (T, N, ...) float32, and the value of the state after
    the last step (N,)."""
    obs: np.ndarray
    action: np.ndarray
    logprob: np.ndarray
    value: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    finished_return: np.ndarray   # the return of the episode that ended at (t, i), else 0
    finished_length: np.ndarray
    next_value: np.ndarray

    def episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(returns, lengths) of the episodes that ended in this batch, in time order."""
        ended = self.done > 0
        return self.finished_return[ended], self.finished_length[ended]


class Rollout:
    """A compiled program running `steps_per_call` steps of `num_envs` environments of `env`.

    seed   the first environment counter and the sampling seed

    The number of environments is a symbolic dim of the graph and the input `explore` (1: sample
    the action, 0: take the policy's mode) is fed per call, so `evaluate` runs the same compiled
    program on other environments, deterministically, and then puts the training state back.
    """

    def __init__(self, env: Env, policy: Policy, num_envs: int, steps_per_call: int, *, seed: int = 0,
                 backend: str = "cpu", **compile_options):
        self.env, self.policy, self.num_envs, self.steps_per_call = env, policy, num_envs, steps_per_call
        graph = self.graph = Graph()
        params = policy.declare(graph)
        state = graph.tensor("env_state", ("n", env.state_size))
        episode_return = graph.tensor("episode_return", ("n",))
        episode_length = graph.tensor("episode_length", ("n",))
        sampling_seed = graph.tensor("sampling_seed", ())
        explore = graph.tensor("explore", ())
        records = {name: [] for name in RECORDS}
        current, ret, length = state, episode_return, episode_length
        for k in range(steps_per_call):
            obs = env.observe(current)
            head = policy.actor(params, obs)
            value = policy.value(params, obs)
            mode = policy.mode(params, head)
            # stream k + 1: stream 0 is the environments' reset draws (env.RESET_STREAM)
            action = mode + explore * (policy.sample(params, head, sampling_seed, k + 1) - mode)
            result = env.step(current, policy.env_action(action))
            done = 1.0 - (1.0 - result.terminated) * (1.0 - result.truncated)
            ret, length = ret + result.reward, length + 1.0
            for name, tensor in (("obs", obs), ("action", action), ("logprob", policy.log_prob(params, head, action)),
                                 ("value", value), ("reward", result.reward), ("done", done),
                                 ("finished_return", ret * done), ("finished_length", length * done)):
                records[name].append(tensor)
            ret, length = ret * (1.0 - done), length * (1.0 - done)
            current = result.state
        for name, tensors in records.items():
            stack(tensors, 0).output(name)
        policy.value(params, env.observe(current)).output("next_value")
        graph.update(state, current)
        graph.update(episode_return, ret)
        graph.update(episode_length, length)
        graph.update(sampling_seed, sampling_seed + 1.0)
        started = time.perf_counter()
        self.program = graph.compile(backend, **compile_options)
        self.compile_seconds = time.perf_counter() - started
        self.program.set_inputs(self.fresh_state(num_envs, seed))

    def fresh_state(self, num_envs: int, seed: int) -> dict[str, np.ndarray]:
        """The program's state inputs for `num_envs` environments starting their first episodes."""
        return {"env_state": self.env.initial_state(num_envs, seed), "episode_return": np.zeros(num_envs, np.float32),
                "episode_length": np.zeros(num_envs, np.float32), "sampling_seed": np.float32(seed)}

    def load_params(self, params: dict[str, np.ndarray]) -> None:
        """Use these parameter arrays (by name) from the next call on."""
        self.program.set_inputs(params)

    def collect(self, steps: int, explore: bool = True) -> Batch:
        """Run `steps` steps (a multiple of steps_per_call) from where the last call stopped.

        A non-finite observation (which the classic-control dynamics do not produce from finite
        states) stops collection with ValueDomainError naming the step and the environment."""
        if steps % self.steps_per_call:
            raise ValueDomainError(f"Rollout.collect: steps ({steps}) must be a multiple of steps_per_call "
                                   f"({self.steps_per_call})")
        feed = {"explore": np.float32(explore)}
        outputs = [self.program.run(feed) for _ in range(steps // self.steps_per_call)]
        fields = {name: np.concatenate([out[name] for out in outputs]) for name in RECORDS}
        bad = np.argwhere(~np.isfinite(fields["obs"]).all(axis=-1))
        if bad.size:
            t, i = bad[0]
            raise ValueDomainError(f"{self.env.name}: non-finite observation {fields['obs'][t, i].tolist()} "
                                   f"of environment {i} at step {t} of the rollout")
        return Batch(**fields, next_value=outputs[-1]["next_value"].copy())

    def evaluate(self, episodes: int, seed: int) -> np.ndarray:
        """The returns of the deterministic policy's first episode in each of `episodes` fresh
        environments (run side by side for the time limit); the training state is kept."""
        training = dict(self.program.state)
        self.program.set_inputs(self.fresh_state(episodes, seed))
        try:
            steps = -(-self.env.max_episode_steps // self.steps_per_call) * self.steps_per_call
            batch = self.collect(steps, explore=False)
        finally:
            self.program.set_inputs(training)
        ended = batch.done > 0
        first = ended.argmax(0)  # every environment ends by the time limit
        return batch.finished_return[first, np.arange(episodes)]
