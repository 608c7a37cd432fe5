"""Train PPO with a Gaussian policy on Pendulum-v1 with luminar.rl (everything compiled).

    .venv/bin/python examples/rl_pendulum.py
    .venv/bin/python examples/rl_pendulum.py --iterations 3 --eval-episodes 10

As examples/rl_cartpole.py, with a continuous action: the actor's output is the mean of a
Gaussian with a learned, state-independent standard deviation; the sample, clipped to [-2, 2],
is the torque. Hyperparameters follow rl-baselines3-zoo's Pendulum PPO (16 environments x 256
steps per iteration, minibatches of 64, 10 epochs, gamma 0.9, GAE lambda 0.95, learning rate
1e-3 annealed over --iterations, no entropy bonus; no gSDE) with rewards scaled by 0.1 and an
unclipped value loss. The deterministic policy is evaluated every 2 iterations once the mean
training return reaches -400; training stops when it averages >= -200 over --eval-episodes
episodes. The last line is, e.g.,

    evaluation return: -190.8 over 100 episodes (solved in 163.6 s, 65,536 steps)
"""
from __future__ import annotations

import sys

from luminar import rl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import rl_cartpole  # noqa: E402  (the shared training loop, plot and command line)


def config(args) -> rl.PPOConfig:
    return rl.PPOConfig(num_envs=args.envs, steps=args.steps, steps_per_call=args.steps_per_call, seed=args.seed,
                        total_steps=args.iterations * args.envs * args.steps, gamma=0.9, gae_lambda=0.95,
                        epochs=10, minibatches=64, learning_rate=1e-3, ent_coef=0.0, clip_value_loss=False,
                        reward_scale=0.1)


if __name__ == "__main__":
    rl_cartpole.main(sys.argv[1:], env="Pendulum-v1", target=-200.0, make_config=config,
                     defaults={"iterations": 50, "envs": 16, "steps": 256, "steps_per_call": 4,
                               "out": "rl_pendulum.png", "eval_every": 2, "eval_from": -400.0})
