"""Dynamic sampling with refill (DAPO): an update trains on groups of answers that teach
something. Groups whose answers all scored alike get a zero advantage; instead of training on
a batch thinned by them, the learner takes more rounds of generation (under the same
parameters, so the batch stays on-policy) and puts informative groups in their place, up to
`algorithm.refill_rounds` extra rounds per update. What is left over is discarded and counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentenv_jax.algorithms.token_ppo import TokenPPOHyperparams, informative_groups
from agentenv_jax.networks.language_model import response_mask


def informative_mask(
    rollout: dict[str, np.ndarray], eos_id: int, hp: TokenPPOHyperparams
) -> np.ndarray:
    """`[T, B // group_size]` bool: the groups of `rollout` the update would train on (the
    update's own criterion, `token_ppo.informative_groups`, on the host)."""
    action = rollout["action"]
    t, b, m = action.shape
    lengths = np.asarray(response_mask(action.reshape(t * b, m), eos_id)).sum(-1).reshape(t, b)
    return np.asarray(informative_groups(rollout["reward"], rollout["valid"], lengths, m, hp))


def refilled_rollout(
    rounds: Sequence[dict[str, np.ndarray]],
    informative: Sequence[np.ndarray],
    group_size: int,
    per_env_fields: Sequence[str] = (),
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """One update's rollout, shaped as one round's, from the groups of several `rounds`
    (`[T, B, ...]` fields, and `per_env_fields` `[B, ...]` taken from the last round):
    first the informative groups (`informative[i]` `[T, B // group_size]`), in the order they
    arrived, then, if there are too few, the others in the same order (the update drops them).
    Returns it and, per round, the `[T, B]` rows it left out."""
    t, b = rounds[0]["reward"].shape
    slots = t * b // group_size

    def groups(x: np.ndarray) -> np.ndarray:
        return x.reshape(slots, group_size, *x.shape[2:])

    teaches = np.concatenate([np.asarray(mask).reshape(-1) for mask in informative])
    taken = np.argsort(~teaches, kind="stable")[:slots]
    rollout = {
        name: np.concatenate([groups(r[name]) for r in rounds])[taken].reshape(value.shape)
        for name, value in rounds[0].items()
        if name not in per_env_fields
    }
    rollout |= {name: rounds[-1][name] for name in per_env_fields}
    left = np.ones(len(rounds) * slots, bool)
    left[taken] = False
    left_rows = np.repeat(left.reshape(len(rounds), t, b // group_size), group_size, axis=-1)
    return rollout, list(left_rows)
