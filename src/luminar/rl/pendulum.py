"""Pendulum-v1 as a graph function: gymnasium's PendulumEnv (g = 10), 200-step limit."""
from __future__ import annotations

import math

from ..library.elementwise import clamp, cos, remainder
from .env import Env, Transition, between, columns, rows
from .spaces import Box


def angle_normalize(x):
    """gymnasium's ((x + pi) % (2 pi)) - pi, with Python's (floored) modulo."""
    return remainder(x + math.pi, 2.0 * math.pi) - math.pi


class Pendulum(Env):
    """Physics (theta, theta_dot); action a torque in [-2, 2] (clipped, as gymnasium does inside
    the graph; VectorEnv refuses out-of-range arrays); observation (cos theta, sin theta,
    theta_dot); reward -(theta^2 + 0.1 theta_dot^2 + 0.001 u^2); never terminates."""

    name = "Pendulum-v1"
    physics_size, observation_size = 2, 3
    max_episode_steps = 200
    action_space = Box(-2.0, 2.0, 1)

    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def dynamics(self, physics, action) -> Transition:
        th, thdot = columns(physics)
        u = clamp(action[:, 0], -self.max_torque, self.max_torque)
        costs = angle_normalize(th) ** 2 + 0.1 * thdot * thdot + 0.001 * (u * u)
        newthdot = thdot + (3 * self.g / (2 * self.l) * th.sin() + 3.0 / (self.m * self.l ** 2) * u) * self.dt
        newthdot = clamp(newthdot, -self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        return Transition(rows(newth, newthdot), -costs, costs * 0.0)

    def observation(self, physics):
        th, thdot = columns(physics)
        return rows(cos(th), th.sin(), thdot)

    def reset_physics(self, uniforms):
        th, thdot = columns(uniforms)
        return rows(between(th, -math.pi, math.pi), between(thdot, -1.0, 1.0))
