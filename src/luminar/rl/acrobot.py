"""Acrobot-v1 as a graph function: gymnasium's AcrobotEnv ("book" dynamics, one RK4 step of
dt = 0.2 per action), 500-step limit."""
from __future__ import annotations

import math

from ..library.elementwise import clamp, cos
from .env import Env, Transition, between, columns, rows
from .spaces import Discrete


def wrap(x, low: float, high: float):
    """gymnasium's wrap: shift by (high - low) until x lies in [low, high]. Two shifts each way
    cover |x| < 5 pi, more than one RK4 step from a wrapped angle can reach."""
    span = high - low
    for _ in range(2):
        x = x - x.gt(high) * span + x.lt(low) * span
    return x


class Acrobot(Env):
    """Physics (theta1, theta2, dtheta1, dtheta2); actions 0, 1, 2 apply torque -1, 0, +1; reward
    -1 per step, 0 on the terminal step; terminated when the tip rises above the bar:
    -cos(theta1) - cos(theta1 + theta2) > 1."""

    name = "Acrobot-v1"
    physics_size, observation_size = 4, 6
    max_episode_steps = 500
    action_space = Discrete(3)

    dt = 0.2
    link_length_1 = link_mass_1 = link_mass_2 = link_moi = 1.0
    link_com_pos_1 = link_com_pos_2 = 0.5
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi
    g = 9.8

    def derivatives(self, s, torque):
        """gymnasium's _dsdt ("book" variant): d/dt of (theta1, theta2, dtheta1, dtheta2)."""
        m1, m2, l1 = self.link_mass_1, self.link_mass_2, self.link_length_1
        lc1, lc2, i1, i2, g = self.link_com_pos_1, self.link_com_pos_2, self.link_moi, self.link_moi, self.g
        theta1, theta2, dtheta1, dtheta2 = s
        cos2, sin2 = cos(theta2), theta2.sin()
        d1 = m1 * lc1 ** 2 + m2 * (l1 ** 2 + lc2 ** 2 + 2 * l1 * lc2 * cos2) + i1 + i2
        d2 = m2 * (lc2 ** 2 + l1 * lc2 * cos2) + i2
        phi2 = m2 * lc2 * g * cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2 * dtheta2 * sin2 - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
                + (m1 * lc1 + m2 * l1) * g * cos(theta1 - math.pi / 2) + phi2)
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 * dtheta1 * sin2 - phi2) / (
            m2 * lc2 ** 2 + i2 - d2 * d2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return [dtheta1, dtheta2, ddtheta1, ddtheta2]

    def dynamics(self, physics, action) -> Transition:
        torque = action - 1.0
        s = columns(physics)
        h = self.dt
        # gymnasium's rk4 over t = [0, dt]: one classical Runge-Kutta step (the torque is constant)
        k1 = self.derivatives(s, torque)
        k2 = self.derivatives([y + h / 2.0 * k for y, k in zip(s, k1)], torque)
        k3 = self.derivatives([y + h / 2.0 * k for y, k in zip(s, k2)], torque)
        k4 = self.derivatives([y + h * k for y, k in zip(s, k3)], torque)
        ns = [y + h / 6.0 * (a + 2 * b + 2 * c + d) for y, a, b, c, d in zip(s, k1, k2, k3, k4)]
        theta1, theta2 = wrap(ns[0], -math.pi, math.pi), wrap(ns[1], -math.pi, math.pi)
        dtheta1 = clamp(ns[2], -self.max_vel_1, self.max_vel_1)
        dtheta2 = clamp(ns[3], -self.max_vel_2, self.max_vel_2)
        terminated = (-cos(theta1) - cos(theta2 + theta1)).gt(1.0)
        return Transition(rows(theta1, theta2, dtheta1, dtheta2), terminated - 1.0, terminated)

    def observation(self, physics):
        theta1, theta2, dtheta1, dtheta2 = columns(physics)
        return rows(cos(theta1), theta1.sin(), cos(theta2), theta2.sin(), dtheta1, dtheta2)

    def reset_physics(self, uniforms):
        return between(uniforms, -0.1, 0.1)
