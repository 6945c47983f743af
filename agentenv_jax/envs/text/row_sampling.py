"""How each row of a text env's vector step is sampled, as an env asks for it
(`AgentVectorEnv.row_sampling`) and the policies take it (`TextPolicy.act`, central inference's
request field `sampling`): `float32 [E, 3]`, one row per env of its temperature, its top_p and
the most tokens to generate for it (`inf`: the env's response length)."""

from __future__ import annotations

import numpy as np

SAMPLING_COLUMNS = 3  # temperature, top_p, max_tokens


def default_sampling(rows: int) -> np.ndarray:
    """The policy's own distribution for every row, up to the response length: `(1, 1, inf)`."""
    sampling = np.ones((rows, SAMPLING_COLUMNS), np.float32)
    sampling[:, 2] = np.inf
    return sampling
