"""Frame-stacked images sent once per frame: a segment's `[T, E, H, W, k]` observations hold
each frame up to k times (consecutive stacks share k - 1 frames), so they travel as each step's
newest frame `obs_frame [T, E, H, W]`, the k - 1 older frames of the segment's first step
`obs_head [E, H, W, k - 1]`, and `obs_restart [T, E]`, where a stack starts anew (a new game's
first observation: k copies of its frame). The learner stacks them again (`restack`).

This holds for envs whose stacks follow that rule exactly (`EnvSpaces.stacked_frames`: the
Atari pipeline, `envs.atari`); about k times fewer bytes per segment for k-frame stacks.
"""

from __future__ import annotations

import numpy as np

from agentenv_jax.transport.spec import FieldSpec, MessageSpec

FRAME_FIELDS = ("obs_frame", "obs_head", "obs_restart")


def frame_fields(
    rollout_length: int, num_envs: int, obs_shape: tuple[int, ...], dtype: np.dtype
) -> list[FieldSpec]:
    """The fields that replace a segment's `obs [T, E, H, W, k]`."""
    *image, k = obs_shape
    return [
        FieldSpec("obs_frame", (rollout_length, num_envs, *image), dtype),
        FieldSpec("obs_head", (num_envs, *image, k - 1), dtype),
        FieldSpec("obs_restart", (rollout_length, num_envs), np.uint8),
    ]


def sends_frames(spec: MessageSpec) -> bool:
    """Whether segments of `spec` carry their observations as frames (`frame_fields`)."""
    return any(field.name == "obs_frame" for field in spec.fields)


def stacked_obs_field(spec: MessageSpec) -> FieldSpec:
    """The `obs [T, E, H, W, k]` field a segment of `spec` stands for."""
    if not sends_frames(spec):
        return spec["obs"]
    frame, head = spec["obs_frame"], spec["obs_head"]
    return FieldSpec("obs", (*frame.shape, head.shape[-1] + 1), frame.dtype)


def write_frames(
    fields: dict[str, np.ndarray], t: int, obs: np.ndarray, restart: np.ndarray
) -> None:
    """Row `t` of a segment's frame fields from the stacks `obs [E, H, W, k]` its step acted
    on, `restart [E]` (bool) where they started anew."""
    fields["obs_frame"][t] = obs[..., -1]
    fields["obs_restart"][t] = restart
    if t == 0:
        fields["obs_head"][...] = obs[..., :-1]


def restack(
    frames: np.ndarray, head: np.ndarray, restart: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """The stacks `[T, E, H, W, k]` of one segment: `frames [T, E, H, W]`, `head
    [E, H, W, k - 1]` and `restart [T, E]` as `write_frames` wrote them, written into `out`
    when given (a rollout's columns of this segment, say). Row t's stack is the previous row's
    shifted by one frame with `frames[t]` last (row 0's previous: `head`), or `frames[t]` k
    times where `restart[t]`.

    Computed as a gather, not row by row: slot j of row t holds the frame of step
    t - (k - 1 - j), or of the last restart at or before t if that is later; steps before the
    segment are `head`'s."""
    num_steps, num_envs = restart.shape
    k = head.shape[-1] + 1
    # Every frame the segment's stacks hold, in time order: head's, then the steps'.
    timeline = np.concatenate([np.moveaxis(head, -1, 0), frames])
    t = np.arange(num_steps)[:, None]
    # (-k where none yet: below every step a stack reaches back to, so no effect)
    last_restart = np.maximum.accumulate(np.where(restart.astype(bool), t, -k), axis=0)
    envs = np.arange(num_envs)[None, :]
    stacks = np.empty((*frames.shape, k), dtype=frames.dtype) if out is None else out
    for j in range(k):
        step = np.maximum(t - (k - 1 - j), last_restart)
        stacks[..., j] = timeline[step + k - 1, envs]
    return stacks


def restacked_rollout(segments: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The `[T, B, H, W, k]` observations of a round of frame segments (`[T, E_i, ...]` each),
    joined along the env axis as the rollout's other fields are."""
    frames = [segment["obs_frame"] for segment in segments]
    k = segments[0]["obs_head"].shape[-1] + 1
    shape = (frames[0].shape[0], sum(f.shape[1] for f in frames), *frames[0].shape[2:], k)
    stacks = np.empty(shape, dtype=frames[0].dtype)
    start = 0
    for segment in segments:
        stop = start + segment["obs_frame"].shape[1]
        restack(
            segment["obs_frame"],
            segment["obs_head"],
            segment["obs_restart"],
            out=stacks[:, start:stop],
        )
        start = stop
    return stacks
