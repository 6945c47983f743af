"""Catch: a tiny pixel game for trying image policies in seconds (registered as
`agentenv_jax/Catch-v0`).

A ball falls from a random column of the top row, one row per step; the paddle on the bottom row
moves left, stays or moves right (actions 0, 1, 2). When the ball reaches the bottom row the
episode ends with reward +1 if the paddle is under it and -1 otherwise: `rows - 1` steps. Frames
are uint8 `(rows, columns, 1)`, 255 where the ball and the paddle are, 0 elsewhere. A random
policy scores about -0.6; a good one 1.0 (after Mnih et al., 2014, and bsuite's catch).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

CATCH_ID = "agentenv_jax/Catch-v0"


class Catch(gym.Env):
    """One ball per episode on a `rows x columns` grid (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}
    _PIXELS_PER_CELL = 16  # rgb_array frames, for videos

    def __init__(self, rows: int = 10, columns: int = 5, render_mode: str | None = None):
        if rows < 2 or columns < 1:
            raise ValueError(f"Catch needs rows >= 2 and columns >= 1, got {rows}x{columns}")
        self._rows, self._columns = rows, columns
        self.observation_space = gym.spaces.Box(0, 255, (rows, columns, 1), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._ball = np.zeros(2, np.int64)  # row, column
        self._paddle = columns // 2
        self.render_mode = render_mode

    def _frame(self) -> np.ndarray:
        frame = np.zeros((self._rows, self._columns, 1), np.uint8)
        frame[self._ball[0], self._ball[1], 0] = 255
        frame[self._rows - 1, self._paddle, 0] = 255
        return frame

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._ball[:] = (0, self.np_random.integers(self._columns))
        self._paddle = self._columns // 2
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self._columns - 1))
        self._ball[0] += 1
        landed = self._ball[0] == self._rows - 1
        reward = 0.0
        if landed:
            reward = 1.0 if self._ball[1] == self._paddle else -1.0
        return self._frame(), reward, bool(landed), False, {}

    def render(self) -> np.ndarray | None:
        """The frame as an RGB image, each cell a block of pixels (`render_mode="rgb_array"`)."""
        if self.render_mode != "rgb_array":
            return None
        cells = np.repeat(self._frame(), 3, axis=2)
        scale = self._PIXELS_PER_CELL
        return np.repeat(np.repeat(cells, scale, axis=0), scale, axis=1)


def register() -> None:
    """Register `agentenv_jax/Catch-v0` with Gymnasium (once). No time limit: every episode
    ends when the ball lands."""
    if CATCH_ID not in gym.registry:
        gym.register(CATCH_ID, entry_point="agentenv_jax.envs.catch:Catch")
