"""The parallel multi-agent env API of env ranks: a batch of envs stepped together as arrays.

Every agent acts at every step (a parallel env, as PettingZoo's `ParallelEnv`). Agents are the
env's `possible_agents`, in a fixed order: arrays have an agent axis `[E, N, ...]` (E envs, N
agents) and an agent that is not playing (finished before the episode, or absent from this
episode) is marked inactive rather than removed, so shapes never change. Observations are
float32 vectors padded with zeros to the longest agent observation; the env may also have a
global state `[E, S]` for centralised critics (S = 0 if it has none).

Auto-reset happens in the step that ends an episode (gymnasium's SAME_STEP mode): an env's
episode ends when no agent is active any more or the episode is truncated; the step then
returns the first observation of the next episode, and `final_obs`/`final_state` hold the
observation and state the ended episode finished in (used to bootstrap truncated agents).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import gymnasium as gym
import numpy as np


@dataclasses.dataclass
class MultiAgentStep:
    """What `reset` and `step` return; every array has leading axes `[E, N]` or `[E]`.

    * `obs [E, N, D]` float32: each agent's observation (zeros for inactive agents).
    * `state [E, S]` float32: the global state (S may be 0).
    * `reward [E, N]` float32: each agent's reward for the step (0 on reset, and for agents
      that were inactive during the step).
    * `terminated`, `truncated [E, N]` bool: the agent's episode ended in this step (only for
      agents that were active during it; all False on reset).
    * `active [E, N]` bool: which agents act at the NEXT step (after an auto-reset: in the new
      episode).
    * `acted [E, N]` bool: which agents acted in this step (its actions counted); all False on
      reset. Steps of agents that did not act are padding: they carry no learning signal.
    * `final_obs [E, N, D]`, `final_state [E, S]`: where an env's episode ended in this step
      (`episode_ended [E]`), the observation and state it ended in; zeros elsewhere.
    """

    obs: np.ndarray
    state: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    active: np.ndarray
    acted: np.ndarray
    episode_ended: np.ndarray
    final_obs: np.ndarray
    final_state: np.ndarray


class MultiAgentVectorEnv(Protocol):
    """`num_envs` copies of a parallel multi-agent env, stepped together.

    `agents`: the possible agents' names, in array order. `obs_size`: D, the padded
    per-agent observation length. `state_size`: S. `action_space`: one agent's action space
    (every agent shares it: Discrete or Box). `max_episode_steps`: the truncation horizon.

    Agents whose Discrete action spaces differ in size: `action_space` is the largest, and an
    optional attribute `action_counts` (a tuple, one per agent) gives each agent's count; the
    policy then never chooses an action at or beyond an agent's count.
    """

    num_envs: int
    agents: tuple[str, ...]
    obs_size: int
    state_size: int
    action_space: gym.Space
    max_episode_steps: int

    def reset(self, seed: int | None = None) -> MultiAgentStep:
        """Start every env's first episode; env `i` is seeded with `seed + i` when seeded."""
        ...

    def step(self, actions: np.ndarray) -> MultiAgentStep:
        """`actions [E, N]` (int for Discrete) or `[E, N, d]` (Box); actions of inactive agents
        are ignored."""
        ...

    def close(self) -> None: ...
