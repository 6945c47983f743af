"""Trimming text envs' token arrays of padding (`algorithm.length_bucket`): contexts are
left-padded and answers right-padded to the configured lengths, and a batch of short prompts
and short answers (a 43-token chat prompt in 64, a 3-token answer in 16) would otherwise be
generated from and trained on mostly padding. The columns cut are padding in every row, which
no output depends on (positions count from a row's first token)."""

from __future__ import annotations

import numpy as np


def trimmed_lengths(
    obs: np.ndarray, action: np.ndarray, pad_id: int, bucket: int
) -> tuple[int, int]:
    """The context and answer lengths an update's messages need (`obs` `[..., L]` left-padded,
    `action` `[..., M]` right-padded with `pad_id`): the columns from the first that holds a
    token in any message, and up to the last that does, each rounded up to a multiple of
    `bucket` (at least one bucket) and at most L or M."""
    response_length = action.shape[-1]
    used_response = np.flatnonzero((action != pad_id).reshape(-1, response_length).any(axis=0))
    need_response = used_response[-1] + 1 if used_response.size else 0
    return context_length_needed(obs, pad_id, bucket), _bucketed(
        need_response, response_length, bucket
    )


def context_length_needed(obs: np.ndarray, pad_id: int, bucket: int) -> int:
    """The columns of left-padded contexts `obs` `[..., L]` from the first that holds a token in
    any row, rounded up to a multiple of `bucket` (at least one bucket, at most L)."""
    context_length = obs.shape[-1]
    used = np.flatnonzero((obs != pad_id).reshape(-1, context_length).any(axis=0))
    return _bucketed(context_length - used[0] if used.size else 0, context_length, bucket)


def _bucketed(need: int, limit: int, bucket: int) -> int:
    return int(min(limit, max(1, -(-need // bucket)) * bucket))


def trim_text_rollout(rollout: dict[str, np.ndarray], lengths: tuple[int, int]) -> dict:
    """`rollout` with its contexts (`obs`, `last_obs`) cut to their last `lengths[0]` columns
    and its per-token fields (`action`, `log_prob`, `value`) to their first `lengths[1]`. The
    columns cut are padding in every message, which no output depends on (positions count
    from a row's first token), so the update is the same, on fewer tokens."""
    context_length, response_length = lengths
    trimmed = dict(rollout)
    for name in ("obs", "last_obs"):
        trimmed[name] = rollout[name][..., rollout[name].shape[-1] - context_length :]
    for name in ("action", "log_prob", "value"):
        trimmed[name] = rollout[name][..., :response_length]
    return trimmed
