"""Which observation and action spaces the framework supports, and how each one travels.

Observations travel as one Box per env step:
* a Box as it is: uint8 Boxes of shape `(H, W)` or `(H, W, C)` are *images*, kept as uint8 from
  the env rank through the segment messages to the learner (the network scales them by 1/255);
  any other Box travels as float32;
* Discrete, MultiDiscrete and MultiBinary observations, and Dict/Tuple observations of these and
  of non-image Boxes, are flattened into one float32 vector with Gymnasium's `flatten_space`
  semantics (Dict keys sorted, Discrete one-hot); the env factory wraps envs to do so.
Actions: Discrete, MultiDiscrete / MultiBinary (independent categoricals, `int32 [k]`) and 1-D
Boxes with finite bounds. Anything else is an `EnvError` naming the env and the space.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import gymnasium as gym
import numpy as np

# How actions are sampled (`networks.distributions`); defined here, with the spaces that
# decide it, so that reading spaces imports no JAX.
ActionKind = Literal["discrete", "multi_discrete", "continuous"]

_FLATTENED = (
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
    gym.spaces.Dict,
    gym.spaces.Tuple,
)
_FLAT_LEAVES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
_SUPPORTED_OBS = "a Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of these"


class EnvError(ValueError):
    """An env that cannot be made or whose spaces are unsupported; the message says which."""


@dataclasses.dataclass(frozen=True)
class TextSpec:
    """How a text env's observations and actions travel (`envs.text`): token ids.

    An observation is the dialogue so far as `context_length` int32 token ids, left-padded with
    `pad_id` so the newest token is last; an action is one message of `response_length` token
    ids, ended by `eos_id` and `pad_id` after it (a message without `eos_id` fills all of them).
    """

    vocab_size: int
    context_length: int
    response_length: int
    pad_id: int
    bos_id: int
    eos_id: int
    # The reward functions a task's reward sums (`TextTask.reward_names`), whose values travel
    # per transition as `reward_terms` and are logged per update as `reward/<name>`.
    reward_names: tuple[str, ...] = ()
    # Messages per episode round: a multi-turn env under a group baseline starts an episode in
    # every env together every this many steps (`TextVectorEnv(round_turns=...)`); 1 otherwise.
    episode_round: int = 1


@dataclasses.dataclass(frozen=True)
class EnvSpaces:
    """What the learner needs to know about an env, agreed on at start-up."""

    obs_shape: tuple[int, ...]
    action_kind: ActionKind
    # Outputs of the policy head per action: n (Discrete), sum(nvec) (MultiDiscrete), or the
    # Box action vector's length.
    action_size: int
    action_shape: tuple[int, ...]  # one action: () Discrete, (k,) MultiDiscrete, (d,) Box
    action_low: tuple[float, ...] | None  # Box bounds, for clipping sampled actions
    action_high: tuple[float, ...] | None
    obs_dtype: str = "float32"  # "uint8" for images, which travel as bytes end to end
    action_nvec: tuple[int, ...] = ()  # sub-action counts of MultiDiscrete (MultiBinary: 2s)
    # Multi-agent envs (`envs.multi_agent`): agents per env, each a column of the env axis, and
    # how many leading observation entries the policy sees (the rest only the critic; None: all).
    agents: int = 1
    actor_obs_dim: int | None = None
    agent_groups: tuple[int, ...] = ()  # each agent's group index (empty: one group)
    group_names: tuple[str, ...] = ()
    # Each agent's Discrete action count when they differ (empty: all have `action_size`).
    agent_action_counts: tuple[int, ...] = ()
    # Text envs (`envs.text`): observations `[context_length]` and actions `[response_length]`
    # are int32 token ids; None for every other env.
    text: TextSpec | None = None
    # Images `(H, W, k)` whose last axis stacks an env's last k frames, a new game's stack its
    # first frame k times: segments carry one frame per step (`buffers.frame_stacks`); 0: the
    # observations travel whole.
    stacked_frames: int = 0

    @property
    def agent_id_at(self) -> int:
        """Where a multi-agent column's one-hot agent id starts in its observation."""
        return (self.actor_obs_dim or self.obs_dim) - self.agents

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape, dtype=np.int64))

    @property
    def action_dtype(self) -> np.dtype:
        """How actions travel: float32 for Box actions, int32 indices (or token ids) else."""
        return np.dtype(np.float32 if self.action_kind == "continuous" else np.int32)

    @property
    def is_image(self) -> bool:
        return self.obs_dtype == "uint8"

    @property
    def normalizer_dim(self) -> int:
        """Dimension of the running observation statistics: none for images, which are scaled
        by 1/255 in the network instead (see `check_normalization`), nor for token ids."""
        return 0 if self.is_image or self.text is not None else self.obs_dim


def is_image_space(space: gym.Space) -> bool:
    """A uint8 Box of shape `(H, W)` or `(H, W, C)`."""
    return (
        isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)
    )


def _check_flattenable(env_id: str, space: gym.Space, path: str) -> None:
    """Raise `EnvError` naming the key of the first sub-space that cannot be flattened."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _check_flattenable(env_id, sub, f"{path}[{key!r}]")
        return
    if isinstance(space, gym.spaces.Tuple):
        for index, sub in enumerate(space.spaces):
            _check_flattenable(env_id, sub, f"{path}[{index}]")
        return
    if is_image_space(space) and path:
        # Flattening would feed raw pixels to an MLP next to the other keys; a CNN torso sees
        # only whole-observation images.
        raise EnvError(
            f"env.id = {env_id!r}: observation{path} is an image ({space}), which is not "
            "supported inside a Dict/Tuple observation: images must be the whole observation "
            "(wrap the env to return the image alone, or drop the key)"
        )
    if not isinstance(space, _FLAT_LEAVES):
        raise EnvError(
            f"env.id = {env_id!r}: observation{path} is {space}, which is not supported "
            f"inside a Dict/Tuple observation: expected {_SUPPORTED_OBS}"
        )


def observation_space_as_sent(env_id: str, space: gym.Space) -> gym.spaces.Box:
    """The Box an observation space travels as: a Box as it is, the others flattened into a
    float32 vector (Discrete one-hot, Dict keys sorted); `EnvError` when unsupported."""
    if isinstance(space, gym.spaces.Box):
        return space
    if not isinstance(space, _FLATTENED):
        raise EnvError(
            f"env.id = {env_id!r} has observation space {space}, which is not supported: "
            f"expected {_SUPPORTED_OBS}"
        )
    _check_flattenable(env_id, space, "")
    flat = gym.spaces.flatten_space(space)
    return gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32))


def _describe_action(env_id: str, space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise EnvError(
                f"env.id = {env_id!r} has a Discrete action space starting at "
                f"{space.start}: expected start 0"
            )
        return dict(action_kind="discrete", action_size=int(space.n), action_shape=())
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        nvec = (2,) * int(space.shape[0])
        return dict(
            action_kind="multi_discrete",
            action_size=sum(nvec),
            action_shape=(len(nvec),),
            action_nvec=nvec,
        )
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        if np.any(space.start != 0):
            raise EnvError(
                f"env.id = {env_id!r} has a MultiDiscrete action space starting at "
                f"{space.start.tolist()}: expected start 0"
            )
        nvec = tuple(int(n) for n in space.nvec)
        return dict(
            action_kind="multi_discrete",
            action_size=sum(nvec),
            action_shape=(len(nvec),),
            action_nvec=nvec,
        )
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        low, high = np.asarray(space.low), np.asarray(space.high)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise EnvError(
                f"env.id = {env_id!r} has an unbounded Box action space {space}:"
                " expected finite bounds"
            )
        return dict(
            action_kind="continuous",
            action_size=int(space.shape[0]),
            action_shape=tuple(space.shape),
            action_low=tuple(map(float, low)),
            action_high=tuple(map(float, high)),
        )
    raise EnvError(
        f"env.id = {env_id!r} has action space {space}, which is not supported: "
        "expected Discrete, MultiDiscrete, MultiBinary (1-D) or a 1-D Box"
    )


def describe_spaces(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> EnvSpaces:
    """Check that the spaces are supported and describe them as they travel; `EnvError`
    otherwise. `obs_space` may be the env's own or its flattened form (the same result)."""
    obs = observation_space_as_sent(env_id, obs_space)
    action = {"action_low": None, "action_high": None} | _describe_action(env_id, action_space)
    return EnvSpaces(
        obs_shape=tuple(obs.shape),
        obs_dtype="uint8" if is_image_space(obs) else "float32",
        **action,
    )
