"""The learner's window of recent episodes: returns and lengths, per agent in multi-agent envs.

In a multi-agent env every agent's episodes are columns of the rollout (env `e`'s agent `i` is
column `e * N + i`), so the window keeps the last `window` episodes of each agent. Libraries
report multi-agent returns two ways, so both are kept: the *team return*, the sum over agents
of their mean episode return (the mean of the episodes' summed returns when every agent plays
every episode), and the *mean agent return*, the mean over agents. With one agent both are the
plain mean return.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np


class EpisodeWindow:
    """The last `window` episodes of each of `agents` agents (columns `c` of agent `c % agents`)."""

    def __init__(self, window: int, agents: int = 1):
        self.window = window
        self.agents = agents
        self._returns = [collections.deque(maxlen=window) for _ in range(agents)]
        self._lengths = [collections.deque(maxlen=window) for _ in range(agents)]

    def add(self, episode_return: np.ndarray, episode_length: np.ndarray) -> int:
        """Take a segment's finished episodes: `episode_length [T, B]` > 0 where an episode
        ended, with its return in `episode_return [T, B]`. Returns how many ended."""
        ended = episode_length > 0
        for agent in range(self.agents):
            mask = ended[:, agent :: self.agents]
            self._returns[agent].extend(episode_return[:, agent :: self.agents][mask].tolist())
            self._lengths[agent].extend(episode_length[:, agent :: self.agents][mask].tolist())
        return int(ended.sum())

    @property
    def full(self) -> bool:
        """Whether every agent has `window` episodes."""
        return all(len(returns) == self.window for returns in self._returns)

    def reached(self, target: float | None) -> bool:
        """Whether the window is full and its mean return is at least `target` (the run's
        `stop_at_return`; never when None)."""
        return target is not None and self.full and self.return_mean >= target

    def _agent_means(self) -> list[float]:
        return [float(np.mean(returns)) for returns in self._returns if returns]

    @property
    def return_mean(self) -> float:
        """The team return (with one agent: the mean return); NaN until every agent has one."""
        means = self._agent_means()
        return float(np.sum(means)) if len(means) == self.agents else float("nan")

    @property
    def agent_return_mean(self) -> float:
        """The mean over agents of their mean episode return; NaN before any episode."""
        means = self._agent_means()
        return float(np.mean(means)) if means else float("nan")

    @property
    def lengths(self) -> list[int]:
        """Every kept episode's length (agents' episodes together)."""
        return [length for lengths in self._lengths for length in lengths]

    def state(self) -> dict[str, Any]:
        """For a checkpoint: one agent's episodes as flat lists, several as lists of lists."""
        if self.agents == 1:
            return {"returns": list(self._returns[0]), "lengths": list(self._lengths[0])}
        return {
            "returns": [list(returns) for returns in self._returns],
            "lengths": [list(lengths) for lengths in self._lengths],
        }

    def load(self, state: dict[str, Any]) -> None:
        returns, lengths = state["returns"], state["lengths"]
        if self.agents == 1:
            returns, lengths = [returns], [lengths]
        for kept, saved in zip(self._returns + self._lengths, returns + lengths, strict=True):
            kept.extend(saved)
