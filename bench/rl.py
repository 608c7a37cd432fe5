"""RL in the graph: environment steps/s against gymnasium's vector environments, compile times,
and wall-clock to solve CartPole against a CleanRL-style torch PPO; writes bench/RL.md and
bench/rl.json.

    .venv/bin/python bench/rl.py            # everything (~5-10 minutes on 2 CPUs)
    .venv/bin/python bench/rl.py --quick    # smoke run: fewer rounds, no solve race, writes nothing

Steps/s: N = 1,024 environments taking uniformly random actions. luminar runs a program of K
steps per call (actions drawn in the graph by the counter-based hash, environments reset in the
graph); gymnasium steps its vector environment once per call with actions sampled beforehand
(their sampling is not timed). gymnasium 1.4 has a numpy-vectorized implementation only for
CartPole (CartPoleVectorEnv); for the other three its vector environment is SyncVectorEnv (a loop
over numpy environments). Timed interleaved: 15 rounds, one ~0.1 s sample of each side per
round, medians; one thread for both.

Solve: luminar.rl.PPO and bench/rl_torch_ppo.py with the same PPOConfig (examples/rl_cartpole.py's
configuration), one thread each, both until the deterministic policy averages >= 475 over 100
evaluation episodes (checked every 10 iterations once the mean training return reaches 250,
evaluation time included). Compile time is reported separately; the torch peer has none.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before luminar (OpenMP) and torch load
os.environ["LUMINAR_CACHE"] = tempfile.mkdtemp(prefix="luminar-rl-bench-")  # every compile is cold

import numpy as np  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))
import luminar as lm  # noqa: E402
from luminar import rl  # noqa: E402
from luminar.rl.random import uniform  # noqa: E402

NUM_ENVS = 1024
STEPS_PER_CALL = 16
TARGET = 475.0


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- environment steps per second -------------------------------------------------------------------
def random_walk_program(env: rl.Env, steps: int):
    """`steps` steps of every environment with uniformly random actions, one call; the states and
    the seed stay in the program. Outputs the summed reward (so nothing is dead code)."""
    graph = lm.Graph()
    start, seed = graph.tensor("state", ("n", env.state_size)), graph.tensor("seed", ())
    space, state, total = env.action_space, start, None
    for k in range(steps):
        if isinstance(space, rl.Discrete):
            action = lm.floor(uniform(state[:, 0], seed, k + 1) * float(space.n))  # stream 0: resets
        else:
            action = uniform(state[:, :space.size], seed, k + 1) * (space.high - space.low) + space.low
        result = env.step(state, action)
        total = result.reward if total is None else total + result.reward
        state = result.state
    graph.update(start, state)
    graph.update(seed, seed + 1.0)
    total.output("reward_sum")
    started = time.perf_counter()
    program = graph.compile("cpu")
    return program, time.perf_counter() - started


def interleaved_medians(run, rounds: int, sample_s: float = 0.1) -> dict[int, float]:
    """Median seconds per call of contenders 0 and 1: every round takes one sample of each (a
    sample repeats the call for about `sample_s`), so a burst of outside load hits both alike.
    (compiler.target.time_interleaved drops a contender 1.5x slower than the best after a round,
    which suits picking a kernel, not measuring a peer: its median would rest on 1-3 samples.)"""
    reps = {}
    for which in (0, 1):
        started = time.perf_counter()
        run(which, 1)
        reps[which] = max(1, int(sample_s / max(time.perf_counter() - started, 1e-6)))
    samples = {0: [], 1: []}
    for _ in range(rounds):
        for which in (0, 1):
            started = time.perf_counter()
            run(which, reps[which])
            samples[which].append((time.perf_counter() - started) / reps[which])
    return {which: statistics.median(values) for which, values in samples.items()}


def gymnasium_vector_env(name: str, num_envs: int):
    import gymnasium as gym
    try:
        return gym.make_vec(name, num_envs=num_envs, vectorization_mode="vector_entry_point"), "numpy-vectorized"
    except Exception:  # gymnasium has no vectorized implementation of this environment
        return gym.make_vec(name, num_envs=num_envs, vectorization_mode="sync"), "SyncVectorEnv"


def steps_per_second(quick: bool) -> list[dict]:
    rows = []
    for name in rl.ENVIRONMENTS:
        env = rl.make(name)
        program, compile_s = random_walk_program(env, STEPS_PER_CALL)
        program.set_inputs(state=env.initial_state(NUM_ENVS, 0), seed=np.float32(0))
        envs, kind = gymnasium_vector_env(name, NUM_ENVS)
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(64)]
        cursor = [0]

        def run(which, reps):
            for _ in range(reps):
                if which == 0:
                    program.run({})
                else:
                    envs.step(actions[cursor[0] % len(actions)])
                    cursor[0] += 1

        run(0, 2), run(1, 2)  # warm-up
        seconds = interleaved_medians(run, rounds=3 if quick else 15)
        ours = NUM_ENVS * STEPS_PER_CALL / seconds[0]
        theirs = NUM_ENVS / seconds[1]
        rows.append({"env": name, "luminar_steps_per_s": ours, "gymnasium_steps_per_s": theirs, "ratio": ours / theirs,
                     "gymnasium_vector_env": kind, "luminar_compile_s": compile_s,
                     "luminar_kernels": len(program.kernels.kernels)})
        print(f"{name}: luminar {ours / 1e6:.2f}M steps/s, gymnasium ({kind}) {theirs / 1e6:.3f}M, "
              f"ratio {ours / theirs:.1f}x", flush=True)
        envs.close()
    return rows


# -- compile time against the rollout length ---------------------------------------------------------
def compile_times(quick: bool) -> list[dict]:
    """The rollout program (CartPole + policy, 16 environments) for several K, and the GAE
    program for several T: each compiled cold."""
    from luminar.rl.gae import gae_program
    env = rl.CartPole()
    policy = rl.Policy(env.observation_size, env.action_space)
    rows = []
    for k in ((1, 4) if quick else (1, 2, 4, 8)):
        rollout = rl.Rollout(env, policy, 16, k)
        rows.append({"program": "rollout (CartPole, policy, sampling)", "steps_per_call": k,
                     "compile_s": rollout.compile_seconds, "kernels": len(rollout.program.kernels.kernels)})
        print(f"rollout K={k}: {rollout.compile_seconds:.1f} s, {rows[-1]['kernels']} kernels", flush=True)
    shared_cache = os.environ["LUMINAR_CACHE"]
    for steps in ((32,) if quick else (32, 512)):  # the whole PPO (rollout, GAE, update), each in a fresh cache
        os.environ["LUMINAR_CACHE"] = tempfile.mkdtemp(prefix="luminar-rl-bench-")
        started = time.perf_counter()
        ppo = rl.PPO("CartPole-v1", rl.PPOConfig(num_envs=16, steps=steps, steps_per_call=4))
        rows.append({"program": "PPO: rollout K = 4 + GAE + update (4 chained minibatch steps)", "steps": steps,
                     "compile_s": time.perf_counter() - started,
                     "kernels": sum(len(p.kernels.kernels) for p in (ppo.rollout.program, ppo.gae, ppo.update.program))})
        print(f"PPO T={steps}: {rows[-1]['compile_s']:.1f} s", flush=True)
    os.environ["LUMINAR_CACHE"] = shared_cache
    for steps in ((128,) if quick else (32, 128, 512)):
        started = time.perf_counter()
        program = gae_program(steps, 16, 0.99, 0.95)
        rows.append({"program": "GAE", "steps": steps, "compile_s": time.perf_counter() - started,
                     "kernels": len(program.kernels.kernels)})
        print(f"GAE T={steps}: {rows[-1]['compile_s']:.1f} s", flush=True)
    return rows


# -- wall-clock to solve CartPole --------------------------------------------------------------------
def solve_race(seeds=(1, 2)) -> dict:
    """Both sides from each seed, alternating (luminar, torch, luminar, torch): load from other
    tenants then hits both alike."""
    import rl_torch_ppo
    cartpole = example("rl_cartpole")
    runs = []
    for seed in seeds:
        args = argparse.Namespace(envs=16, steps=32, steps_per_call=4, seed=seed, iterations=1000, eval_every=10,
                                  eval_from=250.0, eval_episodes=100)
        config = cartpole.config(args)
        started = time.perf_counter()
        ppo = rl.PPO("CartPole-v1", config)
        compile_s = time.perf_counter() - started
        curve = {"steps": [], "train": [], "eval": [], "iteration_means": []}
        evaluation, seconds = cartpole.train(ppo, args, TARGET, curve)
        ours = {"evaluation": evaluation, "seconds": seconds, "steps": curve["steps"][-1], "compile_s": compile_s}
        print(f"luminar seed {seed}: {ours}", flush=True)
        evaluation, seconds, steps = rl_torch_ppo.train_until_solved(config, "CartPole-v1", TARGET, args.iterations,
                                                                     args.eval_every, args.eval_from)
        theirs = {"evaluation": evaluation, "seconds": seconds, "steps": steps}
        print(f"torch seed {seed}: {theirs}", flush=True)
        runs.append({"seed": seed, "luminar": ours, "torch": theirs, "ratio": theirs["seconds"] / ours["seconds"]})
    fields = ("num_envs", "steps", "steps_per_call", "minibatches", "epochs", "learning_rate", "ent_coef", "total_steps")
    total = {side: sum(r[side]["seconds"] for r in runs) for side in ("luminar", "torch")}
    steps = {side: sum(r[side]["steps"] for r in runs) for side in ("luminar", "torch")}
    return {"config": {k: getattr(config, k) for k in fields}, "runs": runs,
            "ratio": total["torch"] / total["luminar"],
            "ratio_with_compile": total["torch"] / (total["luminar"] + runs[0]["luminar"]["compile_s"]),
            "steps_per_s": {side: steps[side] / total[side] for side in total}}


# -- the report --------------------------------------------------------------------------------------
def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{model}, {os.cpu_count()} CPUs, one thread per side"


def write_report(results: dict) -> None:
    lines = ["# RL in the graph", "",
             f"Measured {results['date']} on {results['machine']} by `make bench-rl` (`.venv/bin/python bench/rl.py`).",
             "Ratios are luminar over the peer, measured in the same run.", "",
             f"## Environment steps/s, N = {NUM_ENVS:,}, random actions (goal: >= 10x gymnasium)", "",
             f"luminar: one compiled call runs {STEPS_PER_CALL} steps of all environments (actions drawn in the graph, "
             "resets in the graph). gymnasium: one `step` of its vector environment per call, actions sampled beforehand.",
             "", "| environment | luminar steps/s | gymnasium steps/s | gymnasium vector env | ratio | goal met |",
             "|---|---:|---:|---|---:|---|"]
    for r in results["steps_per_second"]:
        lines.append(f"| {r['env']} | {r['luminar_steps_per_s'] / 1e6:.2f}M | {r['gymnasium_steps_per_s'] / 1e6:.3f}M | "
                     f"{r['gymnasium_vector_env']} | {r['ratio']:.1f}x | {'yes' if r['ratio'] >= 10 else 'no'} |")
    lines += ["", "## Compile time (cold cache)", "",
              "The rollout is a program of K steps called T / K times, so its compile time depends on K, never on T; "
              "the GAE program is one graph over all T steps (a (T, T) weighting), the same kernels at every T; "
              "so the whole PPO compiles in the same time at T = 32 and T = 512.", "",
              "| program | K or T | compile s | kernels |", "|---|---:|---:|---:|"]
    for r in results["compile"]:
        size = f"K = {r['steps_per_call']}" if "steps_per_call" in r else f"T = {r['steps']}"
        lines.append(f"| {r['program']} | {size} | {r['compile_s']:.1f} | {r['kernels']} |")
    race = results.get("solve")
    if race:
        lines += ["", "## Wall-clock to solve CartPole-v1 (goal: >= 2x faster than torch)", "",
                  f"Same PPOConfig on both sides: {race['config']}. Solved = the deterministic policy averages "
                  f">= {TARGET:g} over 100 evaluation episodes (checked every 10 iterations once the mean training "
                  "return reaches 250; evaluation time included; a side that never gets there stops at 1,000 "
                  "iterations). torch: CleanRL-style PPO (bench/rl_torch_ppo.py) on gymnasium's SyncVectorEnv. "
                  "Each seed runs both sides, one after the other.", "",
                  "| seed | side | evaluation return | env steps | training s | compile s |",
                  "|---|---|---:|---:|---:|---:|"]
        for run in race["runs"]:
            ours, theirs = run["luminar"], run["torch"]
            lines += [f"| {run['seed']} | luminar.rl.PPO | {ours['evaluation']:.1f} | {ours['steps']:,} | "
                      f"{ours['seconds']:.1f} | {ours['compile_s']:.1f} |",
                      f"| {run['seed']} | torch PPO | {theirs['evaluation']:.1f} | {theirs['steps']:,} | "
                      f"{theirs['seconds']:.1f} | - |"]
        lines += ["", f"Ratio (torch's total training seconds / luminar's, over the seeds): **{race['ratio']:.2f}x**; "
                  f"{race['ratio_with_compile']:.2f}x counting luminar's (cold) compile once. Goal met: "
                  f"{'yes' if race['ratio'] >= 2 else 'no'}. How many steps a run needs to solve varies from seed "
                  "to seed, so the training throughput is the steadier comparison: luminar "
                  f"{race['steps_per_s']['luminar']:,.0f} env steps/s of training, torch "
                  f"{race['steps_per_s']['torch']:,.0f}."]
    (HERE / "RL.md").write_text("\n".join(lines) + "\n")
    (HERE / "rl.json").write_text(json.dumps(results, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-solve", action="store_true", help="leave out the CartPole solve race")
    args = parser.parse_args(argv)
    results = {"date": datetime.date.today().isoformat(), "machine": machine(),
               "steps_per_second": steps_per_second(args.quick), "compile": compile_times(args.quick)}
    if not (args.quick or args.skip_solve):
        results["solve"] = solve_race()
    if args.quick:
        print(json.dumps(results, indent=1))
    else:
        write_report(results)
        print((HERE / "RL.md").read_text())


if __name__ == "__main__":
    main()
