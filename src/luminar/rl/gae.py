"""Generalised advantage estimation (Schulman et al. 2016) as one graph over the whole rollout.

With done_t = 1 where the episode ended at step t (terminated or truncated, as CleanRL treats
both), delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t and the recurrence
A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}, unrolled:

    A_t = sum_{k >= t} (gamma lambda)^(k - t) [no episode ended in steps t .. k-1] delta_k

A graph has no loop, so the sum is a (T, T) weighting per environment: the bracket is 1 where the
count of ended episodes before k equals the count before t (a cumulative sum). T^2 N
multiply-adds (T = 128, N = 64: 1M) cost less than T dependent steps would in any loop. The
returns (the critic's targets) are A + V.
"""
from __future__ import annotations

import math

from ..graph import Graph
from ..library.indexing import arange, cat
from ..library.reduce import cumsum
from ..tensor import GraphTensor


def gae(reward: GraphTensor, value: GraphTensor, done: GraphTensor, next_value: GraphTensor,
        gamma: float, lam: float) -> tuple[GraphTensor, GraphTensor]:
    """(advantages, returns), each (T, N), from rewards, values and dones (T, N) and the value of
    the state after the last step (N,)."""
    steps = reward.dims[0]
    following = cat([value[1:], next_value.unsqueeze(0)], 0)  # V_{t+1}
    delta = reward + gamma * following * (1.0 - done) - value
    ended_before = cumsum(done, 0) - done                   # episodes ended in steps 0 .. t-1
    t = arange(reward.graph, steps).reshape(steps, 1)
    k = arange(reward.graph, steps).reshape(1, steps)
    ahead = (k - t)                                           # (T, T): k - t
    decay = (ahead * math.log2(gamma * lam)).exp2() * ahead.ge(0.0) if gamma * lam > 0 else ahead.eq(0.0)
    same_episode = ended_before.unsqueeze(1).eq(ended_before.unsqueeze(0))   # (T, T, N): [t, k, n]
    weights = decay.unsqueeze(2) * same_episode
    advantages = (weights * delta.unsqueeze(0)).sum(1)
    return advantages, advantages + value


def gae_program(steps: int, num_envs: int, gamma: float, lam: float, reward_scale: float = 1.0,
                backend: str = "cpu", **options):
    """A compiled program: inputs reward, value, done (steps, num_envs) and next_value (num_envs,);
    outputs advantages and returns (of the rewards times `reward_scale`)."""
    graph = Graph()
    reward, value, done = (graph.tensor(name, (steps, num_envs)) for name in ("reward", "value", "done"))
    advantages, returns = gae(reward * reward_scale, value, done, graph.tensor("next_value", (num_envs,)), gamma, lam)
    advantages.output("advantages")
    returns.output("returns")
    return graph.compile(backend, **options)
