"""CartPole-v1 as a graph function: gymnasium's CartPoleEnv (Euler integration), 500-step limit."""
from __future__ import annotations

import math

from ..library.elementwise import cos
from .env import Env, Transition, between, columns, rows
from .spaces import Discrete


class CartPole(Env):
    """Physics (x, x_dot, theta, theta_dot); action 0 pushes left, 1 right; reward 1 per step;
    terminated when |x| > 2.4 or |theta| > 12 degrees."""

    name = "CartPole-v1"
    physics_size = observation_size = 4
    max_episode_steps = 500
    action_space = Discrete(2)

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def dynamics(self, physics, action) -> Transition:
        x, x_dot, theta, theta_dot = columns(physics)
        force = action * (2 * self.force_mag) - self.force_mag  # +force_mag for 1, -force_mag for 0
        costheta, sintheta = cos(theta), theta.sin()
        temp = (force + self.polemass_length * theta_dot * theta_dot * sintheta) * (1.0 / self.total_mass)
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta * costheta * (1.0 / self.total_mass)))
        xacc = temp - self.polemass_length * thetaacc * costheta * (1.0 / self.total_mass)
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        outside = (x.lt(-self.x_threshold) + x.gt(self.x_threshold) + theta.lt(-self.theta_threshold)
                   + theta.gt(self.theta_threshold))
        terminated = outside.gt(0.0)
        return Transition(rows(x, x_dot, theta, theta_dot), terminated * 0.0 + 1.0, terminated)

    def observation(self, physics):
        return physics

    def reset_physics(self, uniforms):
        return between(uniforms, -0.05, 0.05)
