"""The MLP actor-critic and its action distributions in plain numpy, for env ranks.

An env rank calls its policy once per vector step on a handful of observations. For a small MLP
a jitted call costs more in dispatch and transfer (~120 µs on CPU) than the arithmetic, which
numpy does in ~20–30 µs. This module evaluates the same parameters (the `ActorCritic` pytree
with `torso: mlp`) and the same sampling rules (Gumbel-max, Gaussian `mean + std * noise`) as
`networks.actor_critic` and `networks.distributions`, in float32, so that for the same
parameters and noise it chooses the same actions (tests compare the two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Per-call arithmetic below which numpy beats a jitted call on CPU (multiply-adds per row):
# a 64x64 MLP is ~10k, a 256x256 one ~140k; CNN torsos always keep the jitted call.
NUMPY_MAX_MACS_PER_ROW = 500_000
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "tanh":
        return np.tanh(x)
    if name == "relu":
        return np.maximum(x, 0.0)
    # flax's gelu is the tanh approximation by default.
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _dense(layer: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return x @ layer["kernel"] + layer["bias"]


def _mlp(torso: dict[str, Any], x: np.ndarray, activation: str) -> np.ndarray:
    for index in range(len(torso)):
        x = _activation(activation, _dense(torso[f"Dense_{index}"], x))
    return x


def mlp_macs_per_row(params: Any) -> int:
    """Multiply-adds of one observation's forward pass (both torsos and heads)."""
    return sum(int(np.prod(leaf.shape)) for leaf in _kernels(params))


def _kernels(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, dict):
        return [k for key, value in tree.items() for k in _kernels(value) if key != "bias"]
    return [tree] if getattr(tree, "ndim", 0) == 2 else []


def actor_critic_forward(
    params: Any, obs: np.ndarray, obs_ndim: int, activation: str, image_obs: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`obs [B, *obs_shape]` -> `(head, value [B])` as `ActorCritic` (torso mlp) computes them:
    head `[B, n]` logits, or `[B, 2, d]` (mean, log-std) when `params` has `log_std`."""
    x = obs.reshape(obs.shape[: obs.ndim - obs_ndim] + (-1,)).astype(np.float32)
    if image_obs:
        x = x / np.float32(255.0)
    # The policy's input: the first entries of the observation when the critic sees more
    # (a multi-agent centralised critic), as many as its first kernel takes.
    actor_x = x[..., : params["actor_torso"]["Dense_0"]["kernel"].shape[0]]
    head = _dense(params["Dense_0"], _mlp(params["actor_torso"], actor_x, activation))
    if "log_std" in params:
        head = np.stack([head, np.broadcast_to(params["log_std"], head.shape)], axis=-2)
    value = _dense(params["Dense_1"], _mlp(params["critic_torso"], x, activation))[..., 0]
    return head, value


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def sample_with_log_prob(
    kind: str, nvec: Sequence[int], head: np.ndarray, noise: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`(action, log_prob [B])` for a head and its noise, as `networks.distributions` samples:
    actions `[B]` int32 (discrete), `[B, k]` int32 (multi_discrete) or `[B, d]` float32."""
    if kind == "continuous":
        mean, log_std = head[:, 0], head[:, 1]
        action = mean + np.exp(log_std) * noise
        z = (action - mean) * np.exp(-log_std)
        log_prob = np.sum(-0.5 * z**2 - log_std - np.float32(0.5 * math.log(2 * math.pi)), axis=-1)
        return action.astype(np.float32), log_prob.astype(np.float32)
    sizes = [head.shape[-1]] if kind == "discrete" else [int(n) for n in nvec]
    bounds = np.cumsum(sizes)[:-1]
    actions, log_prob = [], np.zeros(head.shape[0], np.float32)
    for logits, gumbel in zip(
        np.split(head, bounds, axis=-1), np.split(noise, bounds, axis=-1), strict=True
    ):
        choice = np.argmax(logits + gumbel, axis=-1)
        log_prob += np.take_along_axis(_log_softmax(logits), choice[:, None], axis=-1)[:, 0]
        actions.append(choice.astype(np.int32))
    action = actions[0] if kind == "discrete" else np.stack(actions, axis=-1)
    return action, log_prob
