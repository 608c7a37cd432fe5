"""The PPO update program: several minibatch steps (loss, gradients, clipping, Adam) in one call.

CleanRL's update is `epochs x minibatches` optimizer steps per iteration, each a small step
(a minibatch of 128 rows through two 64-64 MLPs) for which a compiled call's fixed cost (binding
inputs, returning every parameter and Adam moment as a new array) is as large as its kernels. So
one call of this program chains `minibatches_per_call` steps: minibatch k reads rows
[k m, (k + 1) m) of the rows fed (numpy permutes the rollout once per epoch), computes the loss
from the parameters step k - 1 produced, differentiates it (luminar.grad, with respect to those
computed parameters), clips the gradients' global norm and applies torch.optim.Adam's update
(luminar.optim.Adam's own formulas). Parameters, both Adam moments and the step counter are
inputs the graph updates: they stay in the program between calls. The graph grows with
minibatches_per_call, not with the rollout length.
"""
from __future__ import annotations

import numpy as np

from ..autograd import grad
from ..errors import ShapeError
from ..graph import Graph
from ..library.elementwise import clamp, maximum
from ..library.indexing import cat, stack
from ..optim import Adam
from ..optim.clip import clip_grad_norm
from .policy import Policy

FIELDS = ("obs", "action", "old_logprob", "advantage", "returns", "old_value")


def ppo_loss(policy: Policy, config, params: dict, batch: dict):
    """(loss, policy loss, value loss, entropy) of CleanRL's PPO on one minibatch (graph tensors)."""
    c = config
    head = policy.actor(params, batch["obs"])
    ratio = (policy.log_prob(params, head, batch["action"]) - batch["old_logprob"]).exp()
    advantage = batch["advantage"]
    if c.norm_adv:  # per minibatch, with torch's unbiased standard deviation, as CleanRL
        m = advantage.dims[0].value
        centred = advantage - advantage.mean()
        advantage = centred / (((centred * centred).sum() * (1.0 / (m - 1))).sqrt() + 1e-8)
    policy_loss = maximum(-advantage * ratio, -advantage * clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
    value, returns, old_value = policy.value(params, batch["obs"]), batch["returns"], batch["old_value"]
    if c.clip_value_loss:
        clipped = old_value + clamp(value - old_value, -c.clip_coef, c.clip_coef)
        value_loss = 0.5 * maximum((value - returns) ** 2, (clipped - returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((value - returns) ** 2).mean()
    entropy = policy.entropy(params, head).mean()
    return policy_loss - c.ent_coef * entropy + c.vf_coef * value_loss, policy_loss, value_loss, entropy


class MinibatchUpdates:
    """A compiled program of `per_call` PPO minibatch steps (see the module docstring).

    `run(rows, lr)` takes {field: array} with per_call * minibatch_size rows each and returns the
    per_call losses; `params()` the current parameters.
    """

    def __init__(self, policy: Policy, config, initial_params: dict[str, np.ndarray], per_call: int,
                 backend: str = "cpu", **compile_options):
        self.policy, self.config, self.per_call = policy, config, per_call
        self.optimizer = Adam(lr=config.learning_rate, eps=1e-5)
        m = self.minibatch_size = config.minibatch_size
        graph = Graph()
        params = policy.declare(graph)
        names = list(params)
        moments = {(name, kind): graph.tensor(f"adam__{name}__{kind}", params[name].shape)
                   for name in names for kind in ("exp_avg", "exp_avg_sq")}
        step, lr = graph.tensor("adam__step", ()), graph.tensor("adam__lr", ())
        rows = per_call * m
        action_shape = policy.action_space.shape
        data = {"obs": graph.tensor("obs", (rows, policy.observation_size)),
                "action": graph.tensor("action", (rows, *action_shape)),
                **{name: graph.tensor(name, (rows,)) for name in FIELDS[2:]}}
        current, state = dict(params), dict(moments)
        losses, parts = [], []
        for k in range(per_call):
            minibatch = {name: tensor[k * m:(k + 1) * m] for name, tensor in data.items()}
            loss, policy_loss, value_loss, entropy = ppo_loss(policy, config, current, minibatch)
            grads, _ = clip_grad_norm(grad(loss, [current[n] for n in names]), config.max_grad_norm)
            scalars = self.optimizer._scalars(lr, step + float(k), step + float(k + 1))
            for name, g in zip(names, grads):
                moment = {kind: state[name, kind] for kind in ("exp_avg", "exp_avg_sq")}
                current[name], new_moment = self.optimizer._update(current[name], g, moment, scalars)
                for kind, value in new_moment.items():
                    state[name, kind] = value
            losses.append(loss.reshape(1))
            parts.append(stack([policy_loss, value_loss, entropy], 0).reshape(1, 3))
        for name in names:
            graph.update(params[name], current[name])
        for key, tensor in moments.items():
            graph.update(tensor, state[key])
        graph.update(step, step + float(per_call))
        cat(losses, 0).output("loss")
        cat(parts, 0).output("parts")  # per step: policy loss, value loss, entropy
        self.program = graph.compile(backend, **compile_options)
        self.program.set_inputs({**initial_params, "adam__step": np.float32(0),
                                 **{t.node.name: np.zeros(t.shape, np.float32) for t in moments.values()}})
        self._param_names = names
        self.rows = rows

    @property
    def steps_taken(self) -> int:
        return int(self.program.state["adam__step"])

    def params(self) -> dict[str, np.ndarray]:
        """The current parameters by name (the arrays the program holds; do not write to them)."""
        state = self.program.state
        return {name: state[name] for name in self._param_names}

    def run(self, rows: dict[str, np.ndarray], lr: float) -> np.ndarray:
        """per_call minibatch steps on `rows`; returns their losses (per_call,)."""
        for name in FIELDS:
            if rows[name].shape[0] != self.rows:
                raise ShapeError(f"MinibatchUpdates.run: {name!r} has {rows[name].shape[0]} rows, expected "
                                 f"{self.rows} ({self.per_call} minibatches of {self.minibatch_size})")
        return self.program.run({**{name: rows[name] for name in FIELDS}, "adam__lr": np.float32(lr)})["loss"]
