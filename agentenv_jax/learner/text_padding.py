"""Trimming an update's text messages of padding (`algorithm.length_bucket`): contexts are
left-padded and answers right-padded to the configured lengths, and a batch of short prompts
and short answers (a 43-token chat prompt in 64, a 3-token answer in 16) would otherwise train
mostly on padding."""

from __future__ import annotations

import numpy as np


def trimmed_lengths(
    obs: np.ndarray, action: np.ndarray, pad_id: int, bucket: int
) -> tuple[int, int]:
    """The context and answer lengths an update's messages need (`obs` `[..., L]` left-padded,
    `action` `[..., M]` right-padded with `pad_id`): the columns from the first that holds a
    token in any message, and up to the last that does, each rounded up to a multiple of
    `bucket` (at least one bucket) and at most L or M."""
    context_length, response_length = obs.shape[-1], action.shape[-1]
    used_context = np.flatnonzero((obs != pad_id).reshape(-1, context_length).any(axis=0))
    used_response = np.flatnonzero((action != pad_id).reshape(-1, response_length).any(axis=0))
    need_context = context_length - used_context[0] if used_context.size else 0
    need_response = used_response[-1] + 1 if used_response.size else 0

    def bucketed(need: int, limit: int) -> int:
        return int(min(limit, max(1, -(-need // bucket)) * bucket))

    return bucketed(need_context, context_length), bucketed(need_response, response_length)


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
