"""Predator-prey (MPE's `simple_tag` where prey can be caught) as numpy arrays over a batch of envs.

Two teams on a plane with a few fixed round obstacles: predators (slower: accel 3, max speed 1.0,
radius 0.075) chase prey (faster: accel 4, max speed 1.3, radius 0.05). A prey that touches a
predator is caught: it gets -10, terminates in that step and is out of the episode (inactive, no
longer in the physics nor in anyone's observation). Every predator gets +10 for each prey caught
in the step (a team reward; MPE rewards each predator-prey contact pair, here a prey is caught
once). Prey also pay MPE's penalty for leaving the arena: per axis, 0 below |x| = 0.9, then
`10 (|x| - 0.9)` up to 1, then `min(exp(2|x| - 2), 10)`. The episode ends when every prey is
caught (the predators terminate with the last catch) or by truncation at `max_episode_steps`, so
agents finish at different steps: the env for death masking.

Physics is MPE's (see `navigation`): discrete actions `Discrete(5)` (no-op, left, right, down,
up) push with the agent's accel, damping 0.25, dt 0.1, soft contacts between agents and with
obstacles (radius 0.2), speeds clipped to the team's max. Agents start uniform in `[-1, 1]^2`,
obstacles in `[-0.9, 0.9]^2`; agents are ordered predators then prey (`predator_i`, `prey_i`).

* Observation of agent i (one layout for both teams, so no padding: `D = 5 + 2L + 5(N-1)` for
  N agents and L obstacles): team bit (1 for predators, 0 for prey), own velocity (2), own
  position (2), each obstacle's position relative to agent i (2L), then for every other agent in
  agent order skipping i: its position relative to agent i (2), its velocity (2), alive flag (1)
  (all 0 once caught). All zeros for a caught prey.
* Global state, `S = 2L + 5N` floats: obstacle positions (2L), then per agent position (2),
  velocity (2), alive flag (1) (position and velocity 0 once caught).

Env i of a batch reset with `seed` draws from its own generator seeded `seed + i` (see
`navigation.env_generators`), so env i of a batch replays a batch of one seeded `seed + i`.
Inside, arrays keep the env axis last, as in `navigation`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.multi_agent.api import MultiAgentStep
from agentenv_jax.envs.multi_agent.navigation import (
    DAMPING,
    DT,
    FAR,
    MOVES,
    contact_forces,
    env_generators,
)

# MPE simple_tag's team constants: predators are MPE's adversaries, prey its good agents.
PREDATOR_SIZE, PREDATOR_ACCEL, PREDATOR_MAX_SPEED = 0.075, 3.0, 1.0
PREY_SIZE, PREY_ACCEL, PREY_MAX_SPEED = 0.05, 4.0, 1.3
OBSTACLE_SIZE = 0.2
CATCH_REWARD = 10.0


def arena_penalty(prey_pos: np.ndarray) -> np.ndarray:
    """MPE simple_tag's penalty for prey leaving the arena: positions `[Y, 2, E]` -> `[Y, E]`."""
    x = np.abs(prey_pos)
    # Capped before exp: beyond |x| = 3 the penalty is at its cap of 10 anyway.
    outside = np.minimum(np.exp(2.0 * np.minimum(x, 3.0) - 2.0), 10.0)
    per_axis = np.where(x < 0.9, 0.0, np.where(x < 1.0, (x - 0.9) * 10.0, outside))
    return per_axis.sum(axis=1)


class PredatorPreyVectorEnv:
    """`num_envs` predator-prey envs stepped as arrays (see the module docstring)."""

    def __init__(
        self,
        num_envs: int,
        num_predators: int = 2,
        num_prey: int = 2,
        max_episode_steps: int = 50,
        num_obstacles: int = 2,
    ):
        if min(num_envs, num_predators, num_prey, max_episode_steps) < 1 or num_obstacles < 0:
            raise ValueError(
                "PredatorPreyVectorEnv needs num_envs, num_predators, num_prey and "
                f"max_episode_steps >= 1 and num_obstacles >= 0, got {num_envs}, "
                f"{num_predators}, {num_prey}, {max_episode_steps} and {num_obstacles}"
            )
        p, y, num_obstacles = num_predators, num_prey, num_obstacles
        n = p + y
        self.num_envs = num_envs
        self.agents = tuple([f"predator_{i}" for i in range(p)] + [f"prey_{i}" for i in range(y)])
        self.obs_size = 5 + 2 * num_obstacles + 5 * (n - 1)
        self.state_size = 2 * num_obstacles + 5 * n
        self.action_space = gym.spaces.Discrete(5)
        self.max_episode_steps = max_episode_steps
        self.num_predators, self.num_prey, self.num_obstacles = p, y, num_obstacles
        # Obstacles, predators, prey in one env-last array; `_pos` is the agents.
        self._entity_pos = np.zeros((num_obstacles + n, 2, num_envs))
        self._pos = self._entity_pos[num_obstacles:]
        self._vel = np.zeros((n, 2, num_envs))
        self._alive = np.ones((n, num_envs), bool)
        self._steps = np.zeros(num_envs, np.int64)
        self._generators: list[np.random.Generator] | None = None

        is_predator = np.arange(n) < p
        agent_size = np.where(is_predator, PREDATOR_SIZE, PREY_SIZE)
        entity_size = np.concatenate([np.full(num_obstacles, OBSTACLE_SIZE), agent_size])
        self._dist_min = (agent_size[:, None] + entity_size[None, :])[:, :, None]  # [N, M, 1]
        self._max_speed = np.where(is_predator, PREDATOR_MAX_SPEED, PREY_MAX_SPEED)[:, None]
        accel = np.where(is_predator, PREDATOR_ACCEL, PREY_ACCEL)
        self._move_forces = accel[:, None, None] * MOVES  # [N, 5, 2]
        self._agent_index = np.arange(n)[:, None]
        team = is_predator.astype(np.float64)[:, None, None]
        self._team = np.broadcast_to(team, (n, 1, num_envs))
        self._self_far = np.zeros((n, num_obstacles + n, 1))
        self._self_far[np.arange(n), num_obstacles + np.arange(n)] = FAR
        others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int64)
        self._others = others.reshape(n, n - 1)
        self._rows = np.arange(n)[:, None]
        # Each env's draws at a reset, agents then obstacles, as `low + range * u` (what
        # `Generator.uniform` computes): agents in [-1, 1], obstacles in [-0.9, 0.9].
        self._draw_low = np.repeat([-1.0, -0.9], [2 * n, 2 * num_obstacles])
        self._draw_range = np.repeat([2.0, 1.8], [2 * n, 2 * num_obstacles])
        # Geometry of the last observation, without the pairs that do not touch: the next step's
        # contact forces.
        self._rel = np.zeros((n, num_obstacles + n, 2, num_envs))
        self._dist = np.full((n, num_obstacles + n, num_envs), FAR)

    def reset(self, seed: int | None = None) -> MultiAgentStep:
        """Start every env's first episode; env `i` is seeded with `seed + i` when seeded."""
        self._generators = env_generators(self.num_envs, seed, self._generators)
        self._reset_envs(np.arange(self.num_envs))
        obs, state = self._observe(*self._geometry())
        e, n = self.num_envs, len(self.agents)
        no = np.zeros((e, n), bool)
        return MultiAgentStep(
            obs=obs,
            state=state,
            reward=np.zeros((e, n), np.float32),
            terminated=no,
            truncated=no.copy(),
            active=self._alive.T.copy(),
            acted=no.copy(),
            episode_ended=np.zeros(e, bool),
            final_obs=np.zeros_like(obs),
            final_state=np.zeros_like(state),
        )

    def step(self, actions: np.ndarray) -> MultiAgentStep:
        """`actions [E, N]` ints in `[0, 5)`; those of caught prey are ignored."""
        if self._generators is None:
            raise RuntimeError("PredatorPreyVectorEnv.step called before reset")
        actions = np.asarray(actions)
        e, n, p = self.num_envs, len(self.agents), self.num_predators
        if actions.shape != (e, n):
            raise ValueError(f"actions must have shape {(e, n)}, got {actions.shape}")
        acting = self._alive.copy()  # [N, E]
        force = contact_forces(self._rel, self._dist, self._dist_min)
        force += self._move_forces[self._agent_index, actions.T].transpose(0, 2, 1)
        force *= acting[:, None]  # caught prey stay where they were caught
        force *= DT
        self._pos += self._vel * DT
        self._vel *= 1.0 - DAMPING
        self._vel += force
        speed = np.sqrt(np.einsum("nke,nke->ne", self._vel, self._vel))
        self._vel *= np.minimum(1.0, self._max_speed / np.maximum(speed, 1e-12))[:, None]
        self._steps += 1

        rel, dist = self._geometry()
        # Predators are in play for the whole episode, so only the prey's flags matter here.
        first_prey = self.num_obstacles + p
        touching = dist[:p, first_prey:] < self._dist_min[:p, first_prey:]  # [P, Y, E]
        caught = self._alive[p:] & touching.any(axis=0)  # [Y, E]
        reward = np.empty((n, e))
        reward[:p] = CATCH_REWARD * caught.sum(axis=0)
        prey_reward = -CATCH_REWARD * caught - arena_penalty(self._pos[p:])
        reward[p:] = np.where(acting[p:], prey_reward, 0.0)
        self._alive[p:] &= ~caught
        self._vel[p:] *= self._alive[p:, None]
        all_caught = ~self._alive[p:].any(axis=0)  # [E]

        terminated = np.empty((n, e), bool)
        terminated[:p] = all_caught
        terminated[p:] = caught
        at_limit = self._steps >= self.max_episode_steps
        truncated = acting & ~terminated & at_limit
        ended = all_caught | at_limit
        obs, state = self._observe(rel, dist)
        final_obs = np.zeros_like(obs)
        final_state = np.zeros_like(state)
        if ended.any():
            final_obs[ended] = obs[ended]
            final_state[ended] = state[ended]
            self._reset_envs(np.flatnonzero(ended))
            obs, state = self._observe(*self._geometry())
        return MultiAgentStep(
            obs=obs,
            state=state,
            reward=reward.T.astype(np.float32, order="C"),
            terminated=terminated.T.copy(),
            truncated=truncated.T.copy(),
            active=self._alive.T.copy(),
            acted=acting.T.copy(),
            episode_ended=ended,
            final_obs=final_obs,
            final_state=final_state,
        )

    def set_world(
        self,
        agent_pos: np.ndarray,
        obstacle_pos: np.ndarray,
        agent_vel: np.ndarray | None = None,
    ) -> None:
        """Place every env's agents `[E, N, 2]` and obstacles `[E, L, 2]` (velocities `[E, N, 2]`,
        zero by default) in the current episodes: for tests and scripted starts. Call after
        `reset`; the next `step` moves from there."""
        self._pos[...] = np.moveaxis(agent_pos, 0, -1)
        self._entity_pos[: self.num_obstacles] = np.moveaxis(obstacle_pos, 0, -1)
        self._vel[...] = 0.0 if agent_vel is None else np.moveaxis(agent_vel, 0, -1)
        self._vel *= self._alive[:, None]
        self._observe(*self._geometry())

    def close(self) -> None:
        """Nothing to release."""

    def _reset_envs(self, envs: np.ndarray) -> None:
        """Draw new episodes for `envs` from their own generators (a loop only over the envs
        that reset: each has its own generator, which is what makes env i reproducible)."""
        assert self._generators is not None
        n, num_obstacles = len(self.agents), self.num_obstacles
        draws = np.empty((len(envs), 2 * (n + num_obstacles)))
        for row, i in zip(draws, envs, strict=True):
            self._generators[i].random(out=row)
        draws = self._draw_low + self._draw_range * draws
        draws = draws.reshape(len(envs), n + num_obstacles, 2).transpose(1, 2, 0)
        self._pos[:, :, envs] = draws[:n]
        self._entity_pos[:num_obstacles, :, envs] = draws[n:]
        self._vel[:, :, envs] = 0.0
        self._alive[:, envs] = True
        self._steps[envs] = 0

    def _geometry(self) -> tuple[np.ndarray, np.ndarray]:
        """Every entity's position relative to every agent `[N, L + N, 2, E]` and their
        distances `[N, L + N, E]` (an agent's distance to itself is `FAR`)."""
        rel = self._entity_pos[None] - self._pos[:, None]
        dist = np.sqrt(np.einsum("nmke,nmke->nme", rel, rel)) + self._self_far
        return rel, dist

    def _observe(self, rel: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`obs [E, N, D]` and `state [E, S]` float32 of the current positions and alive flags;
        keeps the geometry of the agents in play for the next step's contact forces."""
        e, n, num_obstacles = self.num_envs, len(self.agents), self.num_obstacles
        alive = self._alive
        alive_entity = np.concatenate([np.ones((num_obstacles, e), bool), alive])
        in_play = alive[:, None] & alive_entity[None]
        self._rel, self._dist = rel, np.where(in_play, dist, FAR)

        alive_f = alive.astype(np.float64)[:, None]  # [N, 1, E]
        agent_info = np.concatenate(  # [observer, observed, 5, E]
            [
                rel[:, num_obstacles:],
                np.broadcast_to(self._vel[None], (n, n, 2, e)),
                np.broadcast_to(alive_f[None], (n, n, 1, e)),
            ],
            axis=2,
        )
        agent_info *= alive_f[None]  # what is seen of a caught prey: zeros
        others = agent_info[self._rows, self._others].reshape(n, 5 * (n - 1), e)
        obstacles = rel[:, :num_obstacles].reshape(n, 2 * num_obstacles, e)
        obs = np.concatenate([self._team, self._vel, self._pos, obstacles, others], axis=1)
        obs *= alive_f
        per_agent = np.concatenate([self._pos, self._vel, alive_f], axis=1) * alive_f
        obstacle_pos = self._entity_pos[:num_obstacles].reshape(2 * num_obstacles, e)
        state = np.concatenate([obstacle_pos, per_agent.reshape(5 * n, e)])
        return (
            obs.transpose(2, 0, 1).astype(np.float32, order="C"),
            state.T.astype(np.float32, order="C"),
        )
