"""luminar.rl: the graph environments against gymnasium, step by step; the compiled VectorEnv's
checks; the rollout, GAE and PPO programs against numpy and torch references.

How the environments are compared: gymnasium keeps CartPole's, Acrobot's, MountainCar's and
Pendulum's state in float64 while luminar computes in float32. So every step starts both from the
*same* state (luminar's float32 state, widened to float64 and written into gymnasium's
`env.unwrapped.state` and TimeLimit's step count) with the same action, and compares what the
one step gives: next physical state, observation and reward within 1e-5 relative to
max(1, |value|) (float32 keeps ~7 digits; Pendulum's angle grows without bound, so an absolute
1e-5 would ask more than float32 holds once |theta| > 100), and terminated / truncated exactly.
Trajectories are not compared over many steps: a chaotic system (Acrobot) amplifies float32
rounding, which says nothing about the dynamics being right. Start states are drawn over the
whole state space, with random episode step counts, so terminations and truncations happen
often within the 1,000 steps.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import luminar as lm
from luminar import rl

gym = pytest.importorskip("gymnasium")

STEPS = 1000
NUM_ENVS = 20
RTOL = 1e-5

# where start states are drawn from (per physical component): the whole region an episode visits
START_BOX = {
    "CartPole-v1": ([-2.4, -2.0, -0.21, -2.5], [2.4, 2.0, 0.21, 2.5]),
    # Acrobot's velocities up to a quarter of their limits: near the limits (|dtheta2| ~ 9 pi) one
    # RK4 step is so ill-conditioned that numpy in float32 differs from float64 by 1e-3 too
    "Acrobot-v1": ([-math.pi, -math.pi, -math.pi, -2.25 * math.pi], [math.pi, math.pi, math.pi, 2.25 * math.pi]),
    "MountainCar-v0": ([-1.2, -0.07], [0.6, 0.07]),
    "Pendulum-v1": ([-3 * math.pi, -8.0], [3 * math.pi, 8.0]),
}


def compiled_step(env: rl.Env):
    graph = lm.Graph()
    state = graph.tensor("state", ("n", env.state_size))
    action = graph.tensor("action", ("n", *env.action_space.shape))
    result = env.step(state, action)
    for field in result._fields:
        getattr(result, field).output(field)
    return graph.compile("cpu")


def random_actions(env: rl.Env, rng, n: int) -> np.ndarray:
    space = env.action_space
    if isinstance(space, rl.Discrete):
        return rng.integers(0, space.n, n).astype(np.float32)
    return rng.uniform(space.low, space.high, (n, space.size)).astype(np.float32)


def gym_step(gym_env, physics: np.ndarray, elapsed: int, action):
    """One gymnasium step from `physics` (widened to float64) at episode step `elapsed`."""
    core = gym_env.unwrapped
    core.state = np.array(physics, np.float64)
    if hasattr(core, "steps_beyond_terminated"):
        core.steps_beyond_terminated = None
    gym_env._elapsed_steps = elapsed  # gym.make's outermost wrapper is the TimeLimit
    obs, reward, terminated, truncated, _ = gym_env.step(action)
    return np.array(core.state, np.float64), obs, reward, terminated, truncated


def assert_close(actual, expected, where: str) -> None:
    """|actual - expected| <= RTOL * max(1, |expected|), element by element."""
    expected = np.asarray(expected, np.float64)
    error = np.abs(np.asarray(actual, np.float64) - expected)
    bad = np.flatnonzero(error > RTOL * np.maximum(1.0, np.abs(expected)))
    assert not bad.size, f"{where}: component {bad[0]} is {actual[bad[0]]}, gymnasium {expected[bad[0]]}"


@pytest.mark.parametrize("name", sorted(rl.ENVIRONMENTS))
def test_environment_matches_gymnasium_step_by_step(name):
    env, gym_env = rl.make(name), gym.make(name)
    assert isinstance(gym_env, gym.wrappers.TimeLimit) and gym_env._max_episode_steps == env.max_episode_steps
    gym_env.reset(seed=0)
    program = compiled_step(env)
    rng = np.random.default_rng(0)
    low, high = START_BOX[name]
    state = env.initial_state(NUM_ENVS, seed=1)
    state[:, :env.physics_size] = rng.uniform(low, high, (NUM_ENVS, env.physics_size))
    state[:, env.physics_size] = rng.integers(env.max_episode_steps - 40, env.max_episode_steps, NUM_ENVS)
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(STEPS // NUM_ENVS):
        actions = random_actions(env, rng, NUM_ENVS)
        out = program(state=state, action=actions)
        for i in range(NUM_ENVS):
            action = int(actions[i]) if isinstance(env.action_space, rl.Discrete) else actions[i]
            physics, obs, reward, terminated, truncated = gym_step(
                gym_env, state[i, :env.physics_size], int(state[i, env.physics_size]), action)
            where = f"{name} env {i} from state {state[i].tolist()} action {action}"
            assert_close(out["obs"][i], obs, where)
            assert abs(out["reward"][i] - reward) <= RTOL * max(1.0, abs(reward)), where
            assert bool(out["terminated"][i]) == terminated and bool(out["truncated"][i]) == truncated, where
            ended["terminated"] += terminated
            ended["truncated"] += truncated
            if terminated or truncated:  # reset in the graph: a fresh episode from the reset distribution
                assert out["state"][i, env.physics_size] == 0 and out["state"][i, -1] == state[i, -1] + 1, where
            else:
                assert_close(out["state"][i, :env.physics_size], physics, where)
                assert out["state"][i, env.physics_size] == state[i, env.physics_size] + 1, where
        state = out["state"].copy()
    # the comparison saw both ways an episode ends (Pendulum never terminates)
    assert ended["truncated"] > 0 and (ended["terminated"] > 0 or name == "Pendulum-v1"), ended
