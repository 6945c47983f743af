"""Message tags and the parameter-broadcast layout shared by every transport."""

from __future__ import annotations

import numpy as np

from agentenv_jax.transport.spec import FieldSpec, MessageSpec

# MPI tags: one per message kind, so each kind keeps MPI's per-tag ordering guarantee.
TAG_PARAMS = 11
TAG_SEGMENT = 12
TAG_CREDIT = 13
TAG_CONTROL = 14  # pickled: stop requests
TAG_FINAL = 15  # pickled: end-of-run reports


def param_message_spec(num_params: int, obs_dim: int) -> MessageSpec:
    """Versioned parameters plus the global normalizer statistics env ranks must apply."""
    return MessageSpec(
        [
            FieldSpec("version", (1,), np.int64),
            FieldSpec("params", (num_params,), np.float32),
            FieldSpec("obs_stats", (1 + 2 * obs_dim,), np.float64),
            FieldSpec("return_stats", (3,), np.float64),
        ]
    )


TAG_SAMPLE_REQUEST = 16
TAG_SAMPLE_ANSWER = 17
TAG_PRIORITIES = 18

# Episodes an answer can report individually; more finished since the last answer are counted
# in `episodes_finished` but not in the return window.
MAX_EPISODES_PER_ANSWER = 32
# Cumulative counters every answer carries (its `counters` field, in this order).
REPLAY_COUNTERS = (
    "size",
    "inserted",
    "overwritten",
    "sampled",
    "produced",
    "pending",
    "episodes_finished",
    "priority_updates",
    "stale_priority_updates",
    "env_faults",
    "restored",
)


def sample_request_spec() -> MessageSpec:
    """Learner -> partition: how many items to draw, how many it may have inserted by now, and
    whether to save the partition (`save_replay` 1) for checkpoint `save_replay_update`."""
    return MessageSpec(
        [
            FieldSpec("request_id", (1,), np.int64),
            FieldSpec("count", (1,), np.int64),
            FieldSpec("insert_allowance", (1,), np.int64),
            FieldSpec("save_replay", (1,), np.int64),
            FieldSpec("save_replay_update", (1,), np.int64),
        ]
    )


def _answer_summary_fields() -> list[FieldSpec]:
    return [
        FieldSpec("request_id", (1,), np.int64),
        FieldSpec("count", (1,), np.int64),
        FieldSpec("mass", (1,), np.float64),
        FieldSpec("counters", (len(REPLAY_COUNTERS),), np.int64),
        FieldSpec("actor_seconds", (3,), np.float64),  # cumulative env, inference, serving time
        FieldSpec("num_episodes", (1,), np.int64),
        FieldSpec("episode_return", (MAX_EPISODES_PER_ANSWER,), np.float32),
        FieldSpec("episode_length", (MAX_EPISODES_PER_ANSWER,), np.int32),
    ]


def sample_summary_spec() -> MessageSpec:
    """What learners tell each other of a partition's answer (`ReplayLearner`): its mass,
    counters and episodes, without the sampled rows. An answer begins with these fields, so
    its first `nbytes` bytes are its summary."""
    return MessageSpec(_answer_summary_fields())


def sample_answer_spec(max_rows: int, obs_shape: tuple[int, ...], action_dim: int) -> MessageSpec:
    """Partition -> learner: up to `max_rows` sampled items, the partition's priority mass and
    counters (reported with every answer), and the episodes it finished since its last answer
    (the summary's fields, first)."""
    return MessageSpec(
        [
            *_answer_summary_fields(),
            FieldSpec("slot", (max_rows,), np.int64),
            FieldSpec("generation", (max_rows,), np.int64),
            FieldSpec("item_id", (max_rows,), np.int64),
            FieldSpec("priority", (max_rows,), np.float64),
            FieldSpec("obs", (max_rows, *obs_shape), np.float32),
            FieldSpec("action", (max_rows, action_dim), np.float32),
            FieldSpec("reward", (max_rows,), np.float32),
            FieldSpec("next_obs", (max_rows, *obs_shape), np.float32),
            FieldSpec("discount", (max_rows,), np.float32),
        ]
    )


def priority_update_spec(max_rows: int) -> MessageSpec:
    """Learner -> partition: new |TD errors| for items it sampled (slot + generation)."""
    return MessageSpec(
        [
            FieldSpec("count", (1,), np.int64),
            FieldSpec("slot", (max_rows,), np.int64),
            FieldSpec("generation", (max_rows,), np.int64),
            FieldSpec("td_error", (max_rows,), np.float32),
        ]
    )


# Central inference (`topology.inference: learner`): an env rank's observations for its
# learner to act on, and the learner's answer.
TAG_INFERENCE_REQUEST = 19
TAG_INFERENCE_REPLY = 20
INFERENCE_ACT = 0  # request kinds: choose actions (with log-probs and values) ...
INFERENCE_VALUE = 1  # ... or only V(obs), for bootstrapping


def inference_request_spec(
    obs_shape: tuple[int, ...], obs_dtype: str, num_envs: int, text: bool = False
) -> MessageSpec:
    """What an env rank asks: the request's kind and its `E` observations; for a text env
    (`text`), also each row's `sampling` (temperature, top_p, most tokens: the columns of
    `envs.text.row_sampling`, which this layer does not import)."""
    fields = [
        FieldSpec("kind", (1,), np.int64),
        FieldSpec("obs", (num_envs, *obs_shape), np.dtype(obs_dtype)),
    ]
    if text:
        fields.append(FieldSpec("sampling", (num_envs, 3), np.float32))
    return MessageSpec(fields)


def inference_reply_spec(
    action_shape: tuple[int, ...],
    action_dtype: np.dtype,
    per_token: tuple[int, ...],
    num_envs: int,
) -> MessageSpec:
    """The learner's answer: actions with their log-probs and values (`per_token`: `(M,)` for a
    text env's messages, else `()`), or `state_value` for a value request; `served_s`, the
    seconds the learner spent answering the batch it was in (the rest of the env rank's wait
    was queueing)."""
    return MessageSpec(
        [
            FieldSpec("action", (num_envs, *action_shape), action_dtype),
            FieldSpec("log_prob", (num_envs, *per_token), np.float32),
            FieldSpec("value", (num_envs, *per_token), np.float32),
            FieldSpec("state_value", (num_envs,), np.float32),
            FieldSpec("served_s", (1,), np.float64),
        ]
    )
