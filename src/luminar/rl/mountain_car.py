"""MountainCar-v0 as a graph function: gymnasium's MountainCarEnv, 200-step limit."""
from __future__ import annotations

from ..library.elementwise import clamp, cos
from .env import Env, Transition, between, columns, rows
from .spaces import Discrete


class MountainCar(Env):
    """Physics (position, velocity); actions 0 (push left), 1 (none), 2 (push right); reward -1
    per step; terminated at position >= 0.5 with velocity >= 0."""

    name = "MountainCar-v0"
    physics_size = observation_size = 2
    max_episode_steps = 200
    action_space = Discrete(3)

    min_position, max_position, max_speed, goal_position = -1.2, 0.6, 0.07, 0.5
    goal_velocity, force, gravity = 0.0, 0.001, 0.0025

    def dynamics(self, physics, action) -> Transition:
        position, velocity = columns(physics)
        velocity = velocity + (action - 1.0) * self.force + cos(position * 3.0) * -self.gravity
        velocity = clamp(velocity, -self.max_speed, self.max_speed)
        position = clamp(position + velocity, self.min_position, self.max_position)
        # gymnasium: `if position == min_position and velocity < 0: velocity = 0` (the wall stops the car)
        at_wall = position.le(self.min_position) * velocity.lt(0.0)
        velocity = velocity * (1.0 - at_wall)
        terminated = position.ge(self.goal_position) * velocity.ge(self.goal_velocity)
        return Transition(rows(position, velocity), terminated * 0.0 - 1.0, terminated)

    def observation(self, physics):
        return physics

    def reset_physics(self, uniforms):
        position, _ = columns(uniforms)
        return rows(between(position, -0.6, -0.4), position * 0.0)
