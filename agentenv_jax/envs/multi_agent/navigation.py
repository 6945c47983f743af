"""Cooperative navigation (MPE's `simple_spread`) as numpy arrays over a batch of envs.

N agents and N landmarks on a plane; the team is rewarded for covering every landmark and each
agent is penalised for bumping into the others. The physics, sizes, reset distribution and
rewards are those of PettingZoo/MPE2's `simple_spread_v3` (`continuous_actions=False`), so an
episode seeded `s` here starts, moves and scores as that env seeded `s` does (the tests check it);
only the (always zero) communication slots of MPE's observation are left out.

* Actions: `Discrete(5)`: no-op, left, right, down, up; each pushes the agent with a force of 5
  (MPE's default sensitivity) along that axis. Agents have mass 1, velocities are damped by 0.25
  per step and integrated with dt = 0.1; agents (radius 0.15) push each other apart with MPE's
  soft contact force; landmarks do not collide.
* Reward (MPE's, with its `local_ratio`, 0.5 by default): agent i gets
  `(1 - local_ratio) * shared + local_ratio * local_i`, where `shared` is minus the sum over
  landmarks of the distance to the closest agent and `local_i` is minus the number of other agents
  agent i overlaps. `local_ratio=0` gives every agent the same shared reward and no collision
  penalty. Rewards are measured after the move.
* Observation of agent i, `D = 4N + 2` floats: own velocity (2), own position (2), every
  landmark's position relative to agent i (2N, landmark order), every other agent's position
  relative to agent i (2(N-1), agent order skipping i).
* Global state, `S = 6N` floats: landmark positions (2N), agent positions (2N), agent velocities
  (2N), each in index order and `(x, y)` pairs.
* Episodes last `max_episode_steps` steps and end by truncation of every agent together; no agent
  terminates, so every env of a batch starts and ends its episodes at the same steps. Positions
  start uniform in `[-1, 1]^2` (agents drawn first, then landmarks, as MPE), velocities at zero.

Env i of a batch reset with `seed` draws from its own `numpy.random.Generator` seeded `seed + i`,
also for its later (auto-)resets, so env i of a batch replays a batch of one seeded `seed + i`.

Inside, arrays keep the env axis last (`[entities, 2, E]`): every numpy operation then runs an
inner loop over the envs rather than over two coordinates, which makes a step at 64 envs about
twice as fast; observations are transposed to the API's `[E, N, D]` once, at the end.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.multi_agent.api import MultiAgentStep

# MPE's world constants (mpe2/_mpe_utils/core.py and simple_spread.py).
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 100.0
CONTACT_MARGIN = 1e-3
DEFAULT_SENSITIVITY = 5.0  # the force of a move for an agent that sets no `accel`
AGENT_SIZE = 0.15
# Unit forces of the discrete actions: no-op, left, right, down, up.
MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
# Added to the distance of pairs that must not interact (an agent and itself, anything and a
# removed agent): their contact force is below 1e-30 and they never overlap.
FAR = 1e9


def contact_forces(rel: np.ndarray, dist: np.ndarray, dist_min: np.ndarray) -> np.ndarray:
    """MPE's soft contact forces on each agent, summed over the entities it touches.

    `rel [N, M, 2, E]` float64: entity m's position relative to agent n in env e; `dist
    [N, M, E]`: their distance (plus `FAR` for pairs that must not interact); `dist_min` `[N, M,
    1]` or a scalar: the sum of their radii. Returns `[N, 2, E]` float64. MPE's force on `a` from
    `b` is `100 * (p_a - p_b) / d * 1e-3 * log(1 + exp(-(d - d_min) / 1e-3))`.
    """
    # log1p(exp(x)) rather than logaddexp(0, x), twice as fast: exp cannot overflow, as
    # x <= d_min / 1e-3 < 709 for every size here. x is clipped at -50 because exp is slow on
    # the subnormal results of far pairs, whose forces (below 1e-20) are lost in rounding anyway.
    x = (dist_min - dist) * (1.0 / CONTACT_MARGIN)
    penetration = np.log1p(np.exp(np.maximum(x, -50.0, out=x), out=x), out=x)
    penetration *= -CONTACT_FORCE * CONTACT_MARGIN  # rel points to the entity: push away
    penetration /= dist
    return np.einsum("nme,nmke->nke", penetration, rel)


def env_generators(
    num_envs: int, seed: int | None, current: list[np.random.Generator] | None
) -> list[np.random.Generator]:
    """One generator per env: env i's seeded `seed + i`; unseeded, the current ones go on (fresh
    ones from OS entropy the first time), as gymnasium's `reset(seed=None)` does."""
    if seed is not None:
        return [np.random.default_rng(seed + i) for i in range(num_envs)]
    if current is not None:
        return current
    return [np.random.default_rng(s) for s in np.random.SeedSequence().spawn(num_envs)]


class NavigationVectorEnv:
    """`num_envs` cooperative navigation envs stepped as arrays (see the module docstring)."""

    def __init__(
        self,
        num_envs: int,
        num_agents: int = 3,
        max_episode_steps: int = 25,
        local_ratio: float = 0.5,
    ):
        if num_envs < 1 or num_agents < 1 or max_episode_steps < 1:
            raise ValueError(
                "NavigationVectorEnv needs num_envs, num_agents and max_episode_steps >= 1, got "
                f"{num_envs}, {num_agents} and {max_episode_steps}"
            )
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError(f"local_ratio is a proportion in [0, 1], got {local_ratio}")
        n = num_agents
        self.num_envs = num_envs
        self.agents = tuple(f"agent_{i}" for i in range(n))
        self.obs_size = 4 * n + 2
        self.state_size = 6 * n
        self.action_space = gym.spaces.Discrete(5)
        self.max_episode_steps = max_episode_steps
        self.local_ratio = local_ratio
        self._num_landmarks = n
        # Landmarks then agents in one env-last array, so one subtraction gives every relative
        # position an observation, the reward and the contact forces need; `_pos` is the agents.
        self._entity_pos = np.zeros((2 * n, 2, num_envs))
        self._pos = self._entity_pos[n:]
        self._vel = np.zeros((n, 2, num_envs))
        # Every env's episode has the same length and all start together, so one step count.
        self._steps = 0
        self._generators: list[np.random.Generator] | None = None
        self._move_forces = MOVES * DEFAULT_SENSITIVITY
        self._self_far = (np.eye(n) * FAR)[:, :, None]
        # Where agent i's observed relative positions sit in its row of `rel` flattened to
        # `[N, (L + N) * 2, E]`: every landmark, then every agent but itself.
        others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int64)
        entities = np.concatenate([np.tile(np.arange(n), (n, 1)), n + others.reshape(n, n - 1)], 1)
        self._obs_columns = (2 * entities[:, :, None] + np.arange(2)).reshape(n, -1)
        self._obs_rows = np.arange(n)[:, None]
        self._all_agents = np.ones((num_envs, n), bool)
        # Agent-agent geometry of the last observation: the next step's contact forces.
        self._agent_rel = np.zeros((n, n, 2, num_envs))
        self._agent_dist = np.full((n, n, num_envs), FAR)

    def reset(self, seed: int | None = None) -> MultiAgentStep:
        """Start every env's first episode; env `i` is seeded with `seed + i` when seeded."""
        self._generators = env_generators(self.num_envs, seed, self._generators)
        self._new_episodes()
        obs, _, _ = self._measure()
        e, n = self.num_envs, len(self.agents)
        no = np.zeros((e, n), bool)
        return MultiAgentStep(
            obs=obs,
            state=self._state(),
            reward=np.zeros((e, n), np.float32),
            terminated=no,
            truncated=no.copy(),
            active=np.ones((e, n), bool),
            acted=no.copy(),
            episode_ended=np.zeros(e, bool),
            final_obs=np.zeros_like(obs),
            final_state=np.zeros((e, self.state_size), np.float32),
        )

    def step(self, actions: np.ndarray) -> MultiAgentStep:
        """`actions [E, N]` ints in `[0, 5)`; every agent acts at every step."""
        if self._generators is None:
            raise RuntimeError("NavigationVectorEnv.step called before reset")
        actions = np.asarray(actions)
        e, n = self.num_envs, len(self.agents)
        if actions.shape != (e, n):
            raise ValueError(f"actions must have shape {(e, n)}, got {actions.shape}")
        # MPE's order: forces from the positions before the move, then move with the old velocity.
        force = contact_forces(self._agent_rel, self._agent_dist, 2 * AGENT_SIZE)
        force += np.take(self._move_forces, actions.T, axis=0).transpose(0, 2, 1)
        force *= DT
        self._pos += self._vel * DT
        self._vel *= 1.0 - DAMPING
        self._vel += force
        self._steps += 1
        ended = self._steps >= self.max_episode_steps
        obs, uncovered, collisions = self._measure()
        reward = collisions * -self.local_ratio
        reward -= (1.0 - self.local_ratio) * uncovered
        state = self._state()
        if ended:
            final_obs, final_state = obs, state
            self._new_episodes()
            obs, _, _ = self._measure()
            state = self._state()
        else:
            final_obs, final_state = (
                np.zeros(obs.shape, obs.dtype),
                np.zeros(state.shape, state.dtype),
            )
        return MultiAgentStep(
            obs=obs,
            state=state,
            reward=reward.T.astype(np.float32, order="C"),
            terminated=np.zeros((e, n), bool),
            truncated=np.full((e, n), ended),
            active=self._all_agents.copy(),  # copies of a template: np.ones is several times slower
            acted=self._all_agents.copy(),
            episode_ended=np.full(e, ended),
            final_obs=final_obs,
            final_state=final_state,
        )

    def set_world(
        self,
        agent_pos: np.ndarray,
        landmark_pos: np.ndarray,
        agent_vel: np.ndarray | None = None,
    ) -> None:
        """Place every env's agents `[E, N, 2]` and landmarks `[E, N, 2]` (velocities `[E, N, 2]`,
        zero by default) in the current episodes: for tests and scripted starts. Call after
        `reset`; the next `step` moves from there."""
        self._pos[...] = np.moveaxis(agent_pos, 0, -1)
        self._entity_pos[: self._num_landmarks] = np.moveaxis(landmark_pos, 0, -1)
        self._vel[...] = 0.0 if agent_vel is None else np.moveaxis(agent_vel, 0, -1)
        self._measure()

    def close(self) -> None:
        """Nothing to release."""

    def _new_episodes(self) -> None:
        """Draw every env's next episode from its own generator (a loop over the envs, once per
        episode: one generator each is what makes env i reproducible): agents then landmarks
        uniform in `[-1, 1]^2`, as MPE draws them (`Generator.uniform` computes `-1 + 2u`)."""
        assert self._generators is not None
        n, num_landmarks = len(self.agents), self._num_landmarks
        draws = np.empty((self.num_envs, 2 * (n + num_landmarks)))
        for row, generator in zip(draws, self._generators, strict=True):
            generator.random(out=row)
        draws = (-1.0 + 2.0 * draws).reshape(self.num_envs, n + num_landmarks, 2)
        self._pos[...] = draws[:, :n].transpose(1, 2, 0)
        self._entity_pos[:num_landmarks] = draws[:, n:].transpose(1, 2, 0)
        self._vel[...] = 0.0
        self._steps = 0

    def _measure(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Observe the current positions: `obs [E, N, D]` float32, the summed distance from each
        landmark to its closest agent `[E]` and each agent's number of overlaps `[N, E]`; keeps
        the agent-agent geometry for the next step's contact forces."""
        n, num_landmarks = len(self.agents), self._num_landmarks
        rel = self._entity_pos[None] - self._pos[:, None]  # [N, L + N, 2, E]
        dist = np.sqrt(np.einsum("nmke,nmke->nme", rel, rel))
        self._agent_rel = rel[:, num_landmarks:]
        self._agent_dist = dist[:, num_landmarks:] + self._self_far
        uncovered = dist[:, :num_landmarks].min(axis=0).sum(axis=0)
        collisions = (self._agent_dist < 2 * AGENT_SIZE).sum(axis=1)
        observed = rel.reshape(n, -1, self.num_envs)[self._obs_rows, self._obs_columns]
        obs = np.concatenate([self._vel, self._pos, observed], axis=1)  # [N, D, E]
        return obs.transpose(2, 0, 1).astype(np.float32, order="C"), uncovered, collisions

    def _state(self) -> np.ndarray:
        """`[E, 6N]` float32: landmark positions, agent positions, agent velocities."""
        e = self.num_envs
        state = np.concatenate([self._entity_pos.reshape(-1, e), self._vel.reshape(-1, e)])
        return state.T.astype(np.float32, order="C")
