"""The peer for bench/rl.py: CleanRL-style PPO (ppo.py) in PyTorch on gymnasium's vector envs.

The same algorithm and hyperparameters as luminar.rl.PPO (its PPOConfig is read, not copied):
separate actor and critic MLPs (64, 64, tanh, orthogonal init), rollouts of `steps` steps of
`num_envs` environments stepped by gymnasium's SyncVectorEnv (same-step autoreset, as luminar's
graph environments reset), GAE, `epochs` epochs of `minibatches` minibatches with the clipped
objective, clipped value loss, entropy bonus, global gradient-norm clipping and Adam (eps 1e-5)
with the learning rate annealed once per iteration. This file is written for the benchmark from
the published algorithm; no CleanRL code is copied.
"""
from __future__ import annotations

import time

import numpy as np


def train_until_solved(config, env_id: str, target: float, max_iterations: int, eval_every: int, eval_from: float,
                       eval_episodes: int = 100, threads: int = 1):
    """Train; every `eval_every` iterations once the mean training return of the last 100 episodes
    reaches `eval_from`, evaluate the deterministic policy on `eval_episodes` episodes. Returns
    (evaluation return, training seconds, environment steps)."""
    import gymnasium as gym
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    shuffle = np.random.default_rng(config.seed)  # the minibatch order
    c = config
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(c.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_size = envs.single_observation_space.shape[0]
    n_actions = envs.single_action_space.n

    def layer(n_in, n_out, std=np.sqrt(2)):
        linear = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(linear.weight, std)
        nn.init.constant_(linear.bias, 0.0)
        return linear

    critic = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
    actor = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, 0.01))
    params = list(critic.parameters()) + list(actor.parameters())
    optimizer = torch.optim.Adam(params, lr=c.learning_rate, eps=1e-5)

    T, N = c.steps, c.num_envs
    obs_buf = torch.zeros((T, N, obs_size))
    actions, logprobs, rewards, dones, values = (torch.zeros((T, N)) for _ in range(5))
    next_obs = torch.tensor(envs.reset(seed=c.seed)[0], dtype=torch.float32)
    episode_return = np.zeros(N)
    recent: list[float] = []
    started = time.perf_counter()
    evaluation = float("nan")
    for iteration in range(1, max_iterations + 1):
        if c.anneal_lr:
            optimizer.param_groups[0]["lr"] = c.learning_rate * max(1.0 - (iteration - 1) / c.iterations, 0.0)
        for t in range(T):
            obs_buf[t] = next_obs
            with torch.no_grad():
                logits = actor(next_obs)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
                logprobs[t], values[t], actions[t] = dist.log_prob(action), critic(next_obs).flatten(), action
            obs, reward, terminated, truncated, _ = envs.step(action.numpy())
            done = terminated | truncated
            episode_return += reward
            recent = (recent + episode_return[done].tolist())[-100:]
            episode_return[done] = 0.0
            rewards[t], dones[t] = torch.tensor(reward, dtype=torch.float32), torch.tensor(done, dtype=torch.float32)
            next_obs = torch.tensor(obs, dtype=torch.float32)
        with torch.no_grad():  # GAE, done_t marking the end of the episode at step t
            next_value = critic(next_obs).flatten()
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                following = next_value if t == T - 1 else values[t + 1]
                delta = rewards[t] + c.gamma * following * (1.0 - dones[t]) - values[t]
                last = delta + c.gamma * c.gae_lambda * (1.0 - dones[t]) * last
                advantages[t] = last
            returns = advantages + values
        b_obs, b_actions, b_logprobs = obs_buf.reshape(-1, obs_size), actions.reshape(-1), logprobs.reshape(-1)
        b_adv, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        for _ in range(c.epochs):
            order = shuffle.permutation(c.batch_size)
            for start in range(0, c.batch_size, c.minibatch_size):
                rows = order[start:start + c.minibatch_size]
                dist = torch.distributions.Categorical(logits=actor(b_obs[rows]))
                ratio = (dist.log_prob(b_actions[rows]) - b_logprobs[rows]).exp()
                adv = b_adv[rows]
                if c.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
                value = critic(b_obs[rows]).flatten()
                if c.clip_value_loss:
                    clipped = b_values[rows] + torch.clamp(value - b_values[rows], -c.clip_coef, c.clip_coef)
                    v_loss = 0.5 * torch.max((value - b_returns[rows]) ** 2, (clipped - b_returns[rows]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((value - b_returns[rows]) ** 2).mean()
                loss = pg_loss - c.ent_coef * dist.entropy().mean() + c.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, c.max_grad_norm)
                optimizer.step()
        if (recent and np.mean(recent) >= eval_from and iteration % eval_every == 0) or iteration == max_iterations:
            evaluation = evaluate(actor, env_id, eval_episodes)
            if evaluation >= target:
                break
    return evaluation, time.perf_counter() - started, iteration * c.batch_size


def evaluate(actor, env_id: str, episodes: int, seed: int = 12345) -> float:
    """Mean return of the argmax policy over the first episode of `episodes` environments."""
    import gymnasium as gym
    import torch
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(episodes)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs = envs.reset(seed=seed)[0]
    total, finished = np.zeros(episodes), np.zeros(episodes, bool)
    while not finished.all():
        with torch.no_grad():
            action = actor(torch.tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
        obs, reward, terminated, truncated, _ = envs.step(action)
        total += reward * ~finished
        finished |= terminated | truncated
    return float(total.mean())
