"""Train PPO on CartPole-v1 with luminar.rl: environments, policy, GAE and update all compiled.

    .venv/bin/python examples/rl_cartpole.py                    # until solved (~1-3 minutes)
    .venv/bin/python examples/rl_cartpole.py --iterations 5 --eval-episodes 10

The environments are graphs too (luminar.rl.CartPole: gymnasium's dynamics, reset inside the
graph), so a rollout of N environments with the policy is one compiled program called T / K
times, never leaving C between the K steps of a call (see luminar/rl/rollout.py). The
hyperparameters are CleanRL's ppo.py CartPole defaults except the number of environments (16:
environments are cheap in the graph) and the rollout length (32), so a batch is 512 steps as in
CleanRL.

Training stops when the deterministic policy averages 475 over --eval-episodes (100) evaluation
episodes, checked every --eval-every iterations once the mean training return (of the last 100
episodes, sampled actions) reaches --eval-from, or after --iterations (and then evaluates). It saves the learning curve (training episode returns and the
evaluations) to --out, and prints the mean training return of the first and the last iteration (that ended episodes),
then the evaluation return as its last line:

    evaluation return: 500.0 over 100 episodes (solved in 61.2 s, 163,840 steps)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from luminar import rl

ENV = "CartPole-v1"


def config(args) -> rl.PPOConfig:
    return rl.PPOConfig(num_envs=args.envs, steps=args.steps, steps_per_call=args.steps_per_call, seed=args.seed)


def train(ppo: rl.PPO, args, target: float, curve: dict) -> tuple[float, float]:
    """Train until the evaluation reaches `target` or the iterations run out; returns (evaluation
    return, training seconds)."""
    recent: list[float] = []
    evaluation, seconds = float("nan"), 0.0
    for stats in ppo.train(args.iterations):
        seconds = stats.seconds
        curve["iteration_means"].append(stats.mean_return)
        recent = (recent + stats.episode_returns.tolist())[-100:]
        curve["steps"].append(stats.env_steps)
        curve["train"].append(float(np.mean(recent)) if recent else float("nan"))
        if stats.iteration % 10 == 0:
            print(f"iteration {stats.iteration}: {stats.env_steps:,} steps, {seconds:.1f} s, "
                  f"mean training return {curve['train'][-1]:.1f}", flush=True)
        last = stats.iteration == args.iterations
        if (recent and np.mean(recent) >= args.eval_from and stats.iteration % args.eval_every == 0) or last:
            evaluation = ppo.evaluate(args.eval_episodes)
            curve["eval"].append((stats.env_steps, evaluation))
            print(f"iteration {stats.iteration}: evaluation {evaluation:.1f}", flush=True)
            if evaluation >= target:
                break
    return evaluation, seconds


def plot(curve: dict, path: str, title: str, target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(curve["steps"], curve["train"], label="training return (mean of last 100 episodes)")
    if curve["eval"]:
        steps, returns = zip(*curve["eval"])
        ax.plot(steps, returns, "o", label="evaluation (deterministic policy)")
    ax.axhline(target, color="grey", linestyle="--", label=f"goal {target:g}")
    ax.set(xlabel="environment steps", ylabel="episode return", title=title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path + ".tmp.png"  # written whole, then renamed: never a half-written PNG
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    plt.close(fig)


def parse_args(argv=None, defaults: dict | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = {"iterations": 1000, "envs": 16, "steps": 32, "steps_per_call": 4, "out": "rl_cartpole.png",
         "eval_every": 10, "eval_from": 250.0, **(defaults or {})}
    parser.add_argument("--iterations", type=int, default=d["iterations"])
    parser.add_argument("--envs", type=int, default=d["envs"])
    parser.add_argument("--steps", type=int, default=d["steps"], help="rollout steps per environment per iteration")
    parser.add_argument("--steps-per-call", type=int, default=d["steps_per_call"])
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=d["eval_every"])
    parser.add_argument("--eval-from", type=float, default=d["eval_from"],
                        help="evaluate only once the mean training return reaches this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=d["out"], help="learning-curve PNG")
    args = parser.parse_args(argv)
    for name in ("iterations", "envs", "steps", "steps_per_call", "eval_episodes", "eval_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps % args.steps_per_call:
        parser.error(f"--steps ({args.steps}) must be a multiple of --steps-per-call ({args.steps_per_call})")
    return args


def main(argv=None, env: str = ENV, defaults: dict | None = None, target: float = 475.0, make_config=config) -> float:
    args = parse_args(argv, defaults)
    started = time.perf_counter()
    ppo = rl.PPO(env, make_config(args))
    print(f"compiled rollout, GAE and update programs in {ppo.compile_seconds:.1f} s", flush=True)
    curve = {"steps": [], "train": [], "eval": [], "iteration_means": []}
    evaluation, seconds = train(ppo, args, target, curve)
    plot(curve, args.out, f"PPO on {env} (luminar.rl)", target)
    steps = curve["steps"][-1]
    total = time.perf_counter() - started
    verdict = f"solved in {seconds:.1f} s, {steps:,} steps" if evaluation >= target else \
        f"not solved after {seconds:.1f} s, {steps:,} steps"
    means = [m for m in curve["iteration_means"] if not np.isnan(m)] or [float("nan")]
    print(f"training return: {means[0]:.1f} in the first iteration, {means[-1]:.1f} in the last")
    print(f"wall-clock: {total:.1f} s including compiles; learning curve in {args.out}")
    print(f"evaluation return: {evaluation:.1f} over {args.eval_episodes} episodes ({verdict})")
    return evaluation


if __name__ == "__main__":
    main(sys.argv[1:])
