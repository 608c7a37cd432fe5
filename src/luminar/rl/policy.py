"""The actor-critic policy as graph functions: two MLPs (actor, critic) over explicit parameters.

The layout is CleanRL's PPO agent: each network is Linear(obs, 64) tanh Linear(64, 64) tanh
Linear(64, out), orthogonally initialised with gain sqrt(2) (the actor's last layer 0.01, the
critic's 1.0) and zero biases. A discrete action space gets a categorical actor (out = number of
actions, logits); a Box gets a Gaussian one (out = action size, the mean) with a
state-independent log standard deviation parameter, initialised to 0.

Parameters are graph inputs named `actor_0_weight`, ..., `log_std`, declared by `declare(graph)`,
so the rollout graph and the PPO update graph read the same named arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph import Graph
from ..library.elementwise import clamp, tanh
from ..library.indexing import arange
from ..library.reduce import argmax, cumsum, log_softmax, softmax
from ..tensor import GraphTensor
from .random import normal, uniform
from .spaces import ActionSpace, Box

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Policy:
    observation_size: int
    action_space: ActionSpace
    hidden: tuple[int, ...] = (64, 64)

    @property
    def continuous(self) -> bool:
        return isinstance(self.action_space, Box)

    @property
    def actor_outputs(self) -> int:
        return self.action_space.size if self.continuous else self.action_space.n

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape (weights stored (in, out): y = x @ w + b)."""
        shapes = {}
        for net, out in (("actor", self.actor_outputs), ("critic", 1)):
            sizes = (self.observation_size, *self.hidden, out)
            for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
                shapes[f"{net}_{k}_weight"], shapes[f"{net}_{k}_bias"] = (n_in, n_out), (n_out,)
        if self.continuous:
            shapes["log_std"] = (self.action_space.size,)
        return shapes

    def initial_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """CleanRL's initialisation (orthogonal weights, zero biases, log_std 0), from numpy's `seed`."""
        rng = np.random.default_rng(seed)
        layers = len(self.hidden)
        params = {}
        for name, shape in self.shapes().items():
            if name.endswith("_weight"):
                last = int(name.split("_")[1]) == layers
                gain = (0.01 if name.startswith("actor") else 1.0) if last else math.sqrt(2.0)
                params[name] = _orthogonal(rng, shape, gain)
            else:
                params[name] = np.zeros(shape, np.float32)
        return params

    def declare(self, graph: Graph) -> dict[str, GraphTensor]:
        """The parameters as inputs of `graph`."""
        return {name: graph.tensor(name, shape) for name, shape in self.shapes().items()}

    # -- the networks ------------------------------------------------------------------------------
    def _mlp(self, params, net: str, x: GraphTensor) -> GraphTensor:
        for k in range(len(self.hidden) + 1):
            x = x @ params[f"{net}_{k}_weight"] + params[f"{net}_{k}_bias"]
            if k < len(self.hidden):
                x = tanh(x)
        return x

    def value(self, params, obs: GraphTensor) -> GraphTensor:
        """The critic's estimate, (N,)."""
        return self._mlp(params, "critic", obs)[:, 0]

    def actor(self, params, obs: GraphTensor) -> GraphTensor:
        """Logits (N, actions) or the Gaussian's mean (N, size)."""
        return self._mlp(params, "actor", obs)

    # -- the action distribution -------------------------------------------------------------------
    def sample(self, params, head: GraphTensor, seed: GraphTensor, stream: int) -> GraphTensor:
        """One action per row of `head` (the actor's output), from the counter-based hash."""
        if self.continuous:
            return head + params["log_std"].exp() * normal(head, seed, stream)
        # inverse CDF: the action is the number of cumulative probabilities below a uniform u
        u = uniform(head[:, 0], seed, stream).unsqueeze(1)
        below = cumsum(softmax(head, -1), -1)[:, :self.actor_outputs - 1].lt(u)
        return below.sum(-1)

    def mode(self, params, head: GraphTensor) -> GraphTensor:
        """The most likely action (for evaluation): the mean, or the logits' argmax."""
        return head if self.continuous else argmax(head, -1)

    def log_prob(self, params, head: GraphTensor, action: GraphTensor) -> GraphTensor:
        """log pi(action | obs), (N,)."""
        if self.continuous:
            log_std = params["log_std"]
            z = (action - head) * (-log_std).exp()
            return (z * z * -0.5 - log_std - 0.5 * LOG_2PI).sum(-1)
        one_hot = action.unsqueeze(1).eq(arange(head.graph, self.actor_outputs))
        return (log_softmax(head, -1) * one_hot).sum(-1)

    def entropy(self, params, head: GraphTensor) -> GraphTensor:
        """The distribution's entropy, (N,)."""
        if self.continuous:
            per_row = (params["log_std"] + 0.5 * (LOG_2PI + 1.0)).sum(-1)
            return head[:, 0] * 0.0 + per_row
        log_p = log_softmax(head, -1)
        return -(log_p.exp() * log_p).sum(-1)

    def env_action(self, action: GraphTensor) -> GraphTensor:
        """What the environment receives: a Gaussian sample clipped to the Box (gymnasium's
        ClipAction, as CleanRL wraps continuous environments); discrete actions as they are."""
        if self.continuous:
            return clamp(action, self.action_space.low, self.action_space.high)
        return action


def _orthogonal(rng: np.random.Generator, shape: tuple[int, int], gain: float) -> np.ndarray:
    """torch.nn.init.orthogonal_ for a (in, out) matrix: orthonormal rows or columns times gain."""
    rows, cols = shape
    flat = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    q = q if rows >= cols else q.T
    return (gain * q[:rows, :cols]).astype(np.float32)
