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


# -- the graph functions' own checks ----------------------------------------------------------------
def test_step_refuses_actions_of_the_wrong_shape_or_batch():
    env = rl.CartPole()
    graph = lm.Graph()
    state = graph.tensor("state", ("n", env.state_size))
    with pytest.raises(lm.ShapeError, match=r"action must have shape \(n,\)"):
        env.step(state, graph.tensor("action", ("n", 1)))
    with pytest.raises(lm.ShapeError, match=r"one per environment of the state \(n, 6\)\), got \(m,\)"):
        env.step(state, graph.tensor("other_batch", ("m",)))
    with pytest.raises(lm.ShapeError, match=r"state must have shape \(N, 6\)"):
        env.step(graph.tensor("physics_only", ("n", 4)), graph.tensor("a", ("n",)))
    with pytest.raises(lm.ShapeError, match=r"action must have shape \(n, 1\)"):
        rl.Pendulum().step(graph.tensor("pendulum_state", ("n", 4)), graph.tensor("torque", ("n",)))


def test_a_compiled_step_refuses_states_and_actions_of_different_batches():
    env = rl.MountainCar()
    program = compiled_step(env)
    with pytest.raises(lm.DimensionError, match=r"input 'state' axis 0: expected n = 3, got 4|input 'action' axis 0: expected n = 4, got 3"):
        program(state=env.initial_state(4), action=np.zeros(3, np.float32))


def test_reset_draws_gymnasium_initial_distributions_from_counters():
    for name, (low, high) in {"CartPole-v1": ([-0.05] * 4, [0.05] * 4), "Acrobot-v1": ([-0.1] * 4, [0.1] * 4),
                              "MountainCar-v0": ([-0.6, 0.0], [-0.4, 0.0]),
                              "Pendulum-v1": ([-math.pi, -1.0], [math.pi, 1.0])}.items():
        env = rl.make(name)
        state = env.initial_state(2000, seed=7)
        physics = state[:, :env.physics_size]
        assert (physics >= np.float32(low)).all() and (physics <= np.float32(high)).all(), name
        spread = np.asarray(high) - np.asarray(low)
        # uniform: the mean sits mid-range, and each component fills its range
        np.testing.assert_allclose(physics.mean(0), (np.asarray(low) + high) / 2, atol=0.03 * spread.max())
        assert (physics.max(0) - physics.min(0) >= 0.98 * spread).all(), name
        assert (state[:, env.physics_size] == 0).all() and (state[:, -1] == 7).all()
        np.testing.assert_array_equal(env.initial_state(2000, seed=7), state)  # seeded: reproducible
        assert not np.array_equal(env.initial_state(2000, seed=8)[:, :env.physics_size], physics)


def test_initial_state_refuses_bad_arguments():
    with pytest.raises(lm.ValueDomainError, match=r"minibatches_per_call \(3\) must divide minibatches \(4\)"):
        rl.PPO("CartPole-v1", rl.PPOConfig(minibatches_per_call=3))
    with pytest.raises(lm.ValueDomainError, match="num_envs must be an int >= 1"):
        rl.CartPole().initial_state(0)
    with pytest.raises(lm.ValueDomainError, match="seed must be an int"):
        rl.CartPole().initial_state(4, seed=-1)
    with pytest.raises(lm.UnsupportedError, match="no environment 'CartPole-v0'"):
        rl.make("CartPole-v0")


# -- the counter-based random numbers ---------------------------------------------------------------
def draws(shape, seed, stream=0, kind="uniform"):
    from luminar.rl import random as rl_random
    graph = lm.Graph()
    like = graph.tensor("like", shape)
    getattr(rl_random, kind)(like, graph.constant(float(seed)), stream).output("u")
    return graph.compile("cpu")(like=np.zeros(shape, np.float32))["u"]


def test_random_numbers_are_uniform_independent_and_seeded():
    u = draws((200_000,), seed=3)
    assert 0 < u.min() and u.max() < 1
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    chi2 = ((counts - u.size / 64) ** 2 / (u.size / 64)).sum()
    assert chi2 < 110, chi2  # 63 degrees of freedom: p ~ 2e-4
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01  # neighbouring indices
    other_seed, other_stream = draws((200_000,), seed=4), draws((200_000,), seed=3, stream=1)
    assert abs(np.corrcoef(u, other_seed)[0, 1]) < 0.01 and abs(np.corrcoef(u, other_stream)[0, 1]) < 0.01
    np.testing.assert_array_equal(draws((200_000,), seed=3), u)
    z = draws((200_000,), seed=5, kind="normal")
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01 and abs((z ** 3).mean()) < 0.03


def test_the_hash_is_a_permutation_of_its_block():
    from luminar.rl import random as rl_random
    graph = lm.Graph()
    like = graph.tensor("like", (1 << 24,))
    rl_random.random_integers(like, graph.constant(11.0)).output("v")
    v = graph.compile("cpu")(like=np.zeros(1 << 24, np.float32))["v"].astype(np.int64)
    assert np.bincount(v, minlength=1 << 24).max() == 1


# -- VectorEnv: compiled, stepped from numpy, checked ------------------------------------------------
def test_vector_env_steps_resets_and_keeps_its_state():
    envs = rl.VectorEnv("CartPole-v1", num_envs=64, seed=0)
    obs = envs.observations()
    assert obs.shape == (64, 4) and np.array_equal(obs, envs.state[:, :4])
    episodes, rng = 0, np.random.default_rng(0)
    for _ in range(100):
        obs, reward, terminated, truncated = envs.step(rng.integers(0, 2, 64))
        assert obs.shape == (64, 4) and (reward == 1).all() and terminated.dtype == bool
        episodes += terminated.sum()
        # where an episode ended, the next observation is a fresh one: |components| < 0.05
        assert (np.abs(envs.observations()[terminated]) < 0.05).all()
    assert episodes > 64  # a random policy ends CartPole episodes in ~20 steps
    envs.reset(num_envs=8, seed=3)  # another number of environments, same program
    assert envs.observations().shape == (8, 4)


def test_vector_env_refuses_bad_actions_and_states_and_changes_nothing():
    envs = rl.VectorEnv("CartPole-v1", num_envs=4)
    before = envs.state.copy()
    with pytest.raises(lm.ShapeError, match=r"expected one discrete action per environment, shape \(4,\), got \(3,\)"):
        envs.step([0, 1, 0])
    with pytest.raises(lm.ShapeError, match=r"shape \(4,\), got \(4, 1\)"):
        envs.step(np.zeros((4, 1)))
    with pytest.raises(lm.ValueDomainError, match=r"action of environment 2 is 2.0; actions are integers in \[0, 2\)"):
        envs.step([0, 1, 2, 0])
    with pytest.raises(lm.ValueDomainError, match="action of environment 0 is 0.5"):
        envs.step([0.5, 1, 1, 0])
    with pytest.raises(lm.DTypeError, match="actions must be numbers"):
        envs.step(["left"] * 4)
    with pytest.raises(lm.ValueDomainError, match="state of environment 1 is not finite"):
        envs.reset(state=np.where(np.arange(4)[:, None] == 1, np.nan, before))
    with pytest.raises(lm.ShapeError, match=r"state must have shape \(N, 6\)"):
        envs.reset(state=np.zeros((4, 4)))
    np.testing.assert_array_equal(envs.state, before)
    pendulum = rl.VectorEnv("Pendulum-v1", num_envs=2)
    with pytest.raises(lm.ValueDomainError, match=r"action of environment 1 is \[2.5\]; actions lie in \[-2.0, 2.0\]"):
        pendulum.step([[0.0], [2.5]])
    with pytest.raises(lm.ShapeError, match=r"expected actions of shape \(2, 1\)"):
        pendulum.step([0.0, 1.0])


def test_vector_env_undoes_a_step_that_gives_a_non_finite_observation():
    envs = rl.VectorEnv("CartPole-v1", num_envs=3)
    state = envs.state.copy()
    state[1, 3] = 3e38  # a finite pole velocity whose square overflows float32
    envs.reset(state=state)
    with pytest.raises(lm.ValueDomainError, match=r"non-finite observation .* of environment 1 \(of 1 such\); the step was undone"):
        envs.step([0, 0, 0])
    np.testing.assert_array_equal(envs.state, state)
    state[1, 3] = np.inf
    with pytest.raises(lm.ValueDomainError, match="the state of environment 1 is not finite"):
        envs.reset(state=state)


# -- GAE, the policy's distributions, the PPO update: against numpy and torch ---------------------------
def test_gae_in_the_graph_matches_the_backward_recurrence():
    from luminar.rl.gae import gae_program
    steps, n, gamma, lam = 24, 5, 0.97, 0.9
    rng = np.random.default_rng(1)
    reward, value = rng.normal(size=(steps, n)).astype(np.float32), rng.normal(size=(steps, n)).astype(np.float32)
    done = (rng.random((steps, n)) < 0.15).astype(np.float32)
    next_value = rng.normal(size=n).astype(np.float32)
    out = gae_program(steps, n, gamma, lam, reward_scale=0.5)(reward=reward, value=value, done=done,
                                                              next_value=next_value)
    expected, last = np.zeros((steps, n)), np.zeros(n)
    for t in reversed(range(steps)):  # CleanRL's loop, with done_t ending the episode at step t
        following = next_value if t == steps - 1 else value[t + 1]
        delta = 0.5 * reward[t] + gamma * following * (1 - done[t]) - value[t]
        last = delta + gamma * lam * (1 - done[t]) * last
        expected[t] = last
    np.testing.assert_allclose(out["advantages"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["returns"], expected + value, rtol=1e-5, atol=1e-5)


def policy_outputs(policy: rl.Policy, params, obs, action):
    graph = lm.Graph()
    p = policy.declare(graph)
    o = graph.tensor("obs", obs.shape)
    a = graph.tensor("action", action.shape)
    head = policy.actor(p, o)
    policy.log_prob(p, head, a).output("log_prob")
    policy.entropy(p, head).output("entropy")
    policy.value(p, o).output("value")
    return graph.compile("cpu")(obs=obs, action=action, **params)


def torch_agent(policy: rl.Policy, params):
    torch = pytest.importorskip("torch")

    def mlp(net, x):
        layers = len(policy.hidden) + 1
        for k in range(layers):
            x = x @ torch.tensor(params[f"{net}_{k}_weight"]) + torch.tensor(params[f"{net}_{k}_bias"])
            x = torch.tanh(x) if k < layers - 1 else x
        return x
    return torch, mlp


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1"])
def test_policy_log_prob_entropy_and_value_match_torch(name):
    env = rl.make(name)
    policy = rl.Policy(env.observation_size, env.action_space)
    params = policy.initial_params(seed=3)
    rng = np.random.default_rng(0)
    for key in params:  # move away from the initialisation (tiny actor outputs, zero biases)
        params[key] = (params[key] + rng.normal(0, 0.3, params[key].shape)).astype(np.float32)
    obs = rng.normal(size=(32, env.observation_size)).astype(np.float32)
    action = random_actions(env, rng, 32)
    out = policy_outputs(policy, params, obs, action)
    torch, mlp = torch_agent(policy, params)
    head = mlp("actor", torch.tensor(obs))
    if policy.continuous:
        dist = torch.distributions.Normal(head, torch.tensor(params["log_std"]).exp())
        log_prob, entropy = dist.log_prob(torch.tensor(action)).sum(-1), dist.entropy().sum(-1)
    else:
        dist = torch.distributions.Categorical(logits=head)
        log_prob, entropy = dist.log_prob(torch.tensor(action).long()), dist.entropy()
    np.testing.assert_allclose(out["log_prob"], log_prob.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["entropy"], entropy.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["value"], mlp("critic", torch.tensor(obs))[:, 0].numpy(), rtol=1e-5, atol=1e-5)


def test_initialisation_is_cleanrls_orthogonal_layout():
    policy = rl.Policy(4, rl.Discrete(2))
    params = policy.initial_params(seed=0)
    w = params["actor_1_weight"]  # 64 x 64, gain sqrt(2): w^T w = 2 I
    np.testing.assert_allclose(w.T @ w, 2 * np.eye(64), atol=1e-5)
    assert abs(np.linalg.norm(params["actor_2_weight"], axis=0) - 0.01).max() < 1e-6
    assert abs(np.linalg.norm(params["critic_2_weight"]) - 1.0) < 1e-6
    assert not any(params[k].any() for k in params if k.endswith("_bias"))


@pytest.fixture(scope="module")
def small_ppo():
    return rl.PPO("CartPole-v1", rl.PPOConfig(num_envs=4, steps=8, steps_per_call=2, minibatches=2,
                                              minibatches_per_call=2, epochs=1))


def torch_ppo_steps(ppo, start: dict, rows: dict, lr: float) -> tuple[list[float], dict]:
    """CleanRL's minibatch steps in torch, one per minibatch of `rows`: the losses and the final
    parameters."""
    torch = pytest.importorskip("torch")
    c = ppo.config
    weights = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    optimizer = torch.optim.Adam(list(weights.values()), lr=lr, eps=1e-5)

    def mlp(net, x):
        for k in range(3):
            x = x @ weights[f"{net}_{k}_weight"] + weights[f"{net}_{k}_bias"]
            x = torch.tanh(x) if k < 2 else x
        return x
    losses, m = [], c.minibatch_size
    for k in range(len(rows["obs"]) // m):
        t = {name: torch.tensor(array[k * m:(k + 1) * m]) for name, array in rows.items()}
        dist = torch.distributions.Categorical(logits=mlp("actor", t["obs"]))
        ratio = (dist.log_prob(t["action"].long()) - t["old_logprob"]).exp()
        adv = (t["advantage"] - t["advantage"].mean()) / (t["advantage"].std() + 1e-8)
        pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
        value = mlp("critic", t["obs"])[:, 0]
        clipped = t["old_value"] + torch.clamp(value - t["old_value"], -c.clip_coef, c.clip_coef)
        v_loss = 0.5 * torch.max((value - t["returns"]) ** 2, (clipped - t["returns"]) ** 2).mean()
        loss = pg - c.ent_coef * dist.entropy().mean() + c.vf_coef * v_loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), c.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in weights.items()}


def test_chained_ppo_updates_match_torch_step_by_step(small_ppo):
    """One call of the update program = two minibatch steps (clipped objective, clipped value
    loss, entropy bonus, gradient clipping, Adam), against the same two steps written in torch."""
    ppo = small_ppo
    program = ppo.update.program
    saved = {name: np.array(value) for name, value in program.state.items()}
    start = {k: np.array(v) for k, v in ppo.params().items()}
    rng = np.random.default_rng(5)
    n = ppo.update.rows
    rows = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n).astype(np.float32),
            "old_logprob": np.log(rng.uniform(0.3, 0.7, n)).astype(np.float32),
            "advantage": rng.normal(size=n).astype(np.float32), "returns": rng.normal(size=n).astype(np.float32),
            "old_value": rng.normal(0, 0.1, n).astype(np.float32)}
    losses = ppo.update.run(rows, lr=1e-3)
    after = {k: np.array(v) for k, v in ppo.params().items()}
    assert ppo.update.steps_taken == 2
    program.set_inputs(saved)  # leave the fixture as it was
    expected_losses, expected = torch_ppo_steps(ppo, start, rows, lr=1e-3)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5, atol=1e-6)
    for key in expected:
        np.testing.assert_allclose(after[key], expected[key], atol=5e-6, err_msg=key)
    assert any(not np.array_equal(after[k], start[k]) for k in start)
    with pytest.raises(lm.ShapeError, match=r"'obs' has 8 rows, expected 32 \(2 minibatches of 16\)"):
        ppo.update.run({k: v[:8] for k, v in rows.items()}, lr=1e-3)


def test_rollout_records_what_the_policy_and_the_environments_did(small_ppo):
    ppo = small_ppo
    batch = ppo.rollout.collect(8)
    assert batch.obs.shape == (8, 4, 4) and batch.action.shape == (8, 4) and batch.next_value.shape == (4,)
    assert set(np.unique(batch.action)) <= {0.0, 1.0} and (batch.reward == 1).all()
    out = policy_outputs(ppo.policy, ppo.params(), batch.obs.reshape(-1, 4), batch.action.reshape(-1))
    np.testing.assert_allclose(batch.logprob.reshape(-1), out["log_prob"], atol=1e-5)
    np.testing.assert_allclose(batch.value.reshape(-1), out["value"], atol=1e-5)
    # within an episode the observation follows CartPole's dynamics from the last one and the action
    program = compiled_step(ppo.env)
    state = ppo.rollout.program.state["env_state"]
    for t in range(7):
        still = batch.done[t] == 0
        padded = np.concatenate([batch.obs[t], np.zeros((4, 2), np.float32)], 1)
        stepped = program(state=padded, action=batch.action[t])["obs"]
        np.testing.assert_allclose(stepped[still], batch.obs[t + 1][still], atol=1e-6)
    assert state.shape == (4, 6)


def test_sampled_actions_follow_the_policys_probabilities():
    env = rl.CartPole()
    policy = rl.Policy(4, env.action_space)
    params = policy.initial_params(seed=0)
    params["actor_2_bias"] = np.array([0.0, np.log(3.0)], np.float32)  # P(action 1) ~ 0.75 everywhere
    rollout = rl.Rollout(env, policy, num_envs=2000, steps_per_call=1, seed=4)
    rollout.load_params(params)
    batch = rollout.collect(1)
    share = batch.action.mean()
    assert abs(share - 0.75) < 0.03, share  # 2,000 draws: 3 standard deviations ~ 0.029
    returns = rollout.evaluate(episodes=20, seed=1)  # the mode: always action 1, so episodes end fast
    assert returns.shape == (20,) and (returns < 30).all()
    assert rollout.program.state["env_state"].shape == (2000, 6)  # the training state is back


def test_ppo_config_refuses_inconsistent_settings():
    with pytest.raises(lm.ValueDomainError, match="steps \\(10\\) must be a multiple of steps_per_call \\(4\\)"):
        rl.PPO("CartPole-v1", rl.PPOConfig(steps=10, steps_per_call=4))
    with pytest.raises(lm.ValueDomainError, match="must split into 3 equal minibatches"):
        rl.PPO("CartPole-v1", rl.PPOConfig(num_envs=4, steps=8, minibatches=3))
    with pytest.raises(lm.ValueDomainError, match=r"minibatches_per_call \(3\) must divide minibatches \(4\)"):
        rl.PPO("CartPole-v1", rl.PPOConfig(minibatches_per_call=3))
    with pytest.raises(lm.ValueDomainError, match="num_envs must be an int >= 1"):
        rl.PPO("CartPole-v1", rl.PPOConfig(num_envs=0))
