"""Bridges to PettingZoo: a `MultiAgentVectorEnv` seen as a `ParallelEnv`, and back.

* `ParallelView` shows the one env of a `MultiAgentVectorEnv` built with `num_envs=1` through
  PettingZoo's parallel API (so the built-in envs pass `pettingzoo.test.parallel_api_test`).
* `PettingZooVectorEnv` runs `num_envs` copies of any PettingZoo `ParallelEnv` as a
  `MultiAgentVectorEnv` (a Python loop over the envs).

PettingZoo is optional: neither class imports it. `ParallelView` implements `ParallelEnv`'s
interface without subclassing it, so that this module imports without PettingZoo installed;
PettingZoo's tools (`parallel_api_test`, `parallel_to_aec`) take it as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.multi_agent.api import MultiAgentStep, MultiAgentVectorEnv

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv


class ParallelView:
    """The one env of `env` (a `MultiAgentVectorEnv` with `num_envs=1`) as a PettingZoo
    `ParallelEnv`, with PettingZoo's episode semantics.

    Agents are named as `env.agents`; `agents` lists those still in play and shrinks as agents
    terminate or are truncated; an agent's observation space is `Box(-inf, inf, (D,), float32)`
    (the padded observation) and its action space a copy of `env.action_space`. `state()` and
    `state_space` exist when the env has a global state (`state_size > 0`).

    PettingZoo envs do not auto-reset: when the vector env's episode ends, the view returns the
    observations and state the episode ended in (`final_obs`, `final_state`), `agents` becomes
    empty, and the episode the vector env auto-reset into waits for `reset()`. `reset()` without
    a seed then starts that episode (it was drawn from the env's own generator as a new reset
    would be), so a view plays the same episodes as env 0 of a batch seeded alike; `reset(seed)`
    (or `reset()` mid-episode) resets the vector env.
    """

    def __init__(self, env: MultiAgentVectorEnv, name: str | None = None):
        if env.num_envs != 1:
            raise ValueError(f"ParallelView needs an env with num_envs=1, got {env.num_envs}")
        self.env = env
        self.metadata: dict[str, Any] = {"name": name or type(env).__name__, "render_modes": []}
        self.render_mode = None
        self.possible_agents = list(env.agents)
        self.agents: list[str] = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        # One space object per agent, returned again on every call (PettingZoo's contract, so
        # that seeding an agent's action space sticks).
        self._observation_spaces = {
            agent: gym.spaces.Box(-np.inf, np.inf, (env.obs_size,), np.float32)
            for agent in self.possible_agents
        }
        self._action_spaces = {
            agent: copy.deepcopy(env.action_space) for agent in self.possible_agents
        }
        if env.state_size > 0:
            self.state_space = gym.spaces.Box(-np.inf, np.inf, (env.state_size,), np.float32)
        self._state = np.zeros(env.state_size, np.float32)
        # The step that ended the last episode: its obs, state and active flags are those of the
        # episode the vector env auto-reset into.
        self._next_episode: MultiAgentStep | None = None

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        return len(self.possible_agents)

    @property
    def unwrapped(self) -> ParallelView:
        return self

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        """Start an episode (see the class docstring); `options` are not used."""
        if seed is None and self._next_episode is not None:
            first = self._next_episode
        else:
            first = self.env.reset(seed=seed)
        self._next_episode = None
        self._state = first.state[0].copy()
        self.agents = [agent for agent, i in self._index.items() if first.active[0, i]]
        observations = {agent: first.obs[0, self._index[agent]].copy() for agent in self.agents}
        return observations, {agent: {} for agent in self.agents}

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[
        dict[str, np.ndarray],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict],
    ]:
        """Step the agents in play (each needs an action); returns dicts keyed by them."""
        if not self.agents:
            raise RuntimeError(f"{self}: step() with no agent in play; call reset()")
        missing = [agent for agent in self.agents if agent not in actions]
        if missing:
            raise ValueError(f"{self}: no action for agents in play {missing}")
        space = self.env.action_space
        batch = np.zeros((1, len(self.possible_agents), *space.shape), space.dtype)
        for agent in self.agents:
            batch[0, self._index[agent]] = actions[agent]
        result = self.env.step(batch)
        ended = bool(result.episode_ended[0])
        obs = result.final_obs[0] if ended else result.obs[0]
        self._state = (result.final_state[0] if ended else result.state[0]).copy()
        played = [(agent, self._index[agent]) for agent in self.agents]
        observations = {agent: obs[i].copy() for agent, i in played}
        rewards = {agent: float(result.reward[0, i]) for agent, i in played}
        terminations = {agent: bool(result.terminated[0, i]) for agent, i in played}
        truncations = {agent: bool(result.truncated[0, i]) for agent, i in played}
        infos: dict[str, dict] = {agent: {} for agent, _ in played}
        self._next_episode = result if ended else None
        if ended:
            self.agents = []
        else:
            self.agents = [agent for agent, i in self._index.items() if result.active[0, i]]
        return observations, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """The global state `[S]` float32 (after an episode's last step: the one it ended in)."""
        if self.env.state_size == 0:
            raise NotImplementedError(f"{self} has no global state")
        return self._state.copy()

    def render(self) -> None:
        """No rendering (`render_modes` is empty)."""
        return None

    def close(self) -> None:
        self.env.close()

    def __str__(self) -> str:
        return self.metadata["name"]


def _largest_discrete(name: str, action_spaces: dict[str, gym.Space]) -> gym.spaces.Discrete:
    """The action space of agents whose Discrete spaces differ in size (each agent's own count
    is `action_counts`); `ValueError` for any other mix."""
    if not all(
        isinstance(s, gym.spaces.Discrete) and int(s.start) == 0 for s in action_spaces.values()
    ):
        raise ValueError(
            f"PettingZooVectorEnv needs the agents of {name} to share one action space, or to "
            f"have Discrete ones (of any sizes), got {action_spaces}"
        )
    return gym.spaces.Discrete(max(int(s.n) for s in action_spaces.values()))


class PettingZooVectorEnv:
    """`num_envs` copies of a PettingZoo `ParallelEnv` (from `make_env`) as a
    `MultiAgentVectorEnv`.

    * Agents: the env's `possible_agents`; an agent absent from `env.agents` is inactive.
    * Observations: each agent's flattened with `gymnasium.spaces.flatten`, as float32, zero-padded
      to the longest (`obs_size`).
    * Global state: the env's `state()`, flattened, when it has a `state_space`; else `S = 0`.
    * Actions: every agent must share one action space, Discrete or Box, or have Discrete ones
      of different sizes (`action_counts`, the API's; else `ValueError`).
    * Horizon: `max_episode_steps` is the env's own when it exposes one (`env.unwrapped.max_cycles`,
      as MPE2's envs do), else the argument (then required). An argument may shorten the env's
      own horizon but not lengthen it (`ValueError`: the env would truncate first; set its
      `max_cycles` instead). The adapter truncates every agent still in play when an episode
      reaches `max_episode_steps`, whether or not the env does.
    * Auto-reset in the step that ends an episode (no agent left in `env.agents`, or the horizon),
      with `final_obs` (the last observations of the agents that acted in that step) and
      `final_state`. An agent that leaves while others play on is inactive from then on; its last
      observation is not kept (fine for terminated agents, which need no bootstrap).
    * Seeding: `reset(seed)` resets env i with `seed + i`; auto-resets pass no seed, so each env
      goes on with its own generator.
    """

    def __init__(
        self,
        make_env: Callable[[], ParallelEnv],
        num_envs: int,
        max_episode_steps: int | None = None,
    ):
        if num_envs < 1:
            raise ValueError(f"PettingZooVectorEnv needs num_envs >= 1, got {num_envs}")
        self._envs = [make_env() for _ in range(num_envs)]
        env = self._envs[0]
        name = str(env)
        self.num_envs = num_envs
        self.agents = tuple(env.possible_agents)
        self._index = {agent: j for j, agent in enumerate(self.agents)}
        action_spaces = {agent: env.action_space(agent) for agent in self.agents}
        space = action_spaces[self.agents[0]]
        if any(other != space for other in action_spaces.values()):
            space = _largest_discrete(name, action_spaces)
            self.action_counts = tuple(int(action_spaces[a].n) for a in self.agents)
        if not isinstance(space, gym.spaces.Discrete | gym.spaces.Box):
            raise ValueError(
                f"PettingZooVectorEnv supports Discrete or Box action spaces; {name} has {space}"
            )
        self.action_space = space
        self._obs_spaces = [env.observation_space(agent) for agent in self.agents]
        self.obs_size = max(gym.spaces.flatdim(s) for s in self._obs_spaces)
        self._state_space = getattr(env, "state_space", None)
        self.state_size = 0 if self._state_space is None else gym.spaces.flatdim(self._state_space)
        own_horizon = getattr(env.unwrapped, "max_cycles", None)
        if own_horizon is not None:
            if max_episode_steps is not None and max_episode_steps > own_horizon:
                raise ValueError(
                    f"{name} truncates its episodes at max_cycles={own_horizon}, before "
                    f"max_episode_steps={max_episode_steps}: set the env's max_cycles instead"
                )
            if max_episode_steps is None:
                max_episode_steps = int(own_horizon)
        elif max_episode_steps is None:
            raise ValueError(f"{name} exposes no max_cycles: pass max_episode_steps")
        self.max_episode_steps = max_episode_steps
        self._steps = np.zeros(num_envs, np.int64)

    def reset(self, seed: int | None = None) -> MultiAgentStep:
        """Start every env's first episode; env `i` is seeded with `seed + i` when seeded."""
        e, n = self.num_envs, len(self.agents)
        obs = np.zeros((e, n, self.obs_size), np.float32)
        state = np.zeros((e, self.state_size), np.float32)
        active = np.zeros((e, n), bool)
        for i, env in enumerate(self._envs):
            observations, _ = env.reset(seed=None if seed is None else seed + i)
            self._write_obs(obs[i], observations, env.agents)
            self._write_state(state[i], env)
            active[i] = [agent in env.agents for agent in self.agents]
        self._steps[:] = 0
        return MultiAgentStep(
            obs=obs,
            state=state,
            reward=np.zeros((e, n), np.float32),
            terminated=np.zeros((e, n), bool),
            truncated=np.zeros((e, n), bool),
            active=active,
            acted=np.zeros((e, n), bool),
            episode_ended=np.zeros(e, bool),
            final_obs=np.zeros_like(obs),
            final_state=np.zeros_like(state),
        )

    def step(self, actions: np.ndarray) -> MultiAgentStep:
        """`actions [E, N]` (Discrete) or `[E, N, *shape]` (Box); those of inactive agents are
        not passed to the envs."""
        e, n = self.num_envs, len(self.agents)
        actions = np.asarray(actions)
        expected = (e, n, *self.action_space.shape)
        if actions.shape != expected:
            raise ValueError(f"actions must have shape {expected}, got {actions.shape}")
        obs = np.zeros((e, n, self.obs_size), np.float32)
        state = np.zeros((e, self.state_size), np.float32)
        final_obs, final_state = np.zeros_like(obs), np.zeros_like(state)
        reward = np.zeros((e, n), np.float32)
        terminated, truncated = np.zeros((e, n), bool), np.zeros((e, n), bool)
        active, acted = np.zeros((e, n), bool), np.zeros((e, n), bool)
        ended = np.zeros(e, bool)
        for i, env in enumerate(self._envs):
            playing = list(env.agents)
            step_actions = {a: self._action(actions[i, self._index[a]]) for a in playing}
            observations, rewards, terminations, truncations, _ = env.step(step_actions)
            self._steps[i] += 1
            for agent in playing:
                j = self._index[agent]
                acted[i, j] = True
                reward[i, j] = rewards.get(agent, 0.0)
                terminated[i, j] = bool(terminations.get(agent, False))
                truncated[i, j] = bool(truncations.get(agent, False))
            if self._steps[i] >= self.max_episode_steps:
                truncated[i] |= acted[i] & ~terminated[i]
            ended[i] = not env.agents or self._steps[i] >= self.max_episode_steps
            if ended[i]:
                self._write_obs(final_obs[i], observations, playing)
                self._write_state(final_state[i], env)
                observations, _ = env.reset()
                self._steps[i] = 0
            self._write_obs(obs[i], observations, env.agents)
            self._write_state(state[i], env)
            active[i] = [agent in env.agents for agent in self.agents]
        return MultiAgentStep(
            obs=obs,
            state=state,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            active=active,
            acted=acted,
            episode_ended=ended,
            final_obs=final_obs,
            final_state=final_state,
        )

    def close(self) -> None:
        for env in self._envs:
            env.close()

    def _action(self, action: np.ndarray) -> Any:
        """One agent's action as its env expects it: an int, or an array of the Box's dtype."""
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return np.asarray(action, self.action_space.dtype)

    def _write_obs(self, row: np.ndarray, observations: dict, agents: list[str]) -> None:
        """Flatten the observations of `agents` into `row [N, D]` (zero padded)."""
        for agent in agents:
            if agent in observations:
                j = self._index[agent]
                flat = gym.spaces.flatten(self._obs_spaces[j], observations[agent])
                row[j, : flat.size] = flat

    def _write_state(self, row: np.ndarray, env: ParallelEnv) -> None:
        if self._state_space is not None:
            row[:] = gym.spaces.flatten(self._state_space, env.state())
