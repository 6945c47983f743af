"""The env rank's policy under central inference: `ActorPolicy`'s interface, answered by the
learner (`learner.inference_server`). The env rank holds no parameters."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from agentenv_jax.envs.text.row_sampling import default_sampling
from agentenv_jax.transport.messages import INFERENCE_ACT, INFERENCE_VALUE
from agentenv_jax.transport.spec import MessageSpec


class RemotePolicy:
    """`act(obs, sampling=None)` and `value(obs)` as requests: `call(request buffer) -> reply
    buffer` (the transport's client, or the in-process server itself)."""

    num_params = 0  # nothing of the model lives here

    def __init__(
        self,
        call: Callable[[np.ndarray], np.ndarray],
        request_spec: MessageSpec,
        reply_spec: MessageSpec,
    ):
        self._call = call
        self._request_spec = request_spec
        self._reply_spec = reply_spec
        self._request = request_spec.allocate()
        self._fields = request_spec.views(self._request)
        self._num_envs = request_spec["obs"].shape[0]
        # Seconds its requests waited for the learner beyond the learner's answering them:
        # the server busy elsewhere (or, answering only between rounds, the learner updating).
        self.queued_s = 0.0

    def set_params(self, flat_params: np.ndarray) -> None:
        """Parameter messages carry the version and normalizer statistics only."""

    def _ask(self, kind: int, obs: np.ndarray) -> dict[str, np.ndarray]:
        if obs.shape[0] != self._num_envs:
            raise ValueError(f"central inference takes {self._num_envs} rows, got {obs.shape}")
        self._fields["kind"][0] = kind
        self._fields["obs"][...] = obs
        tick = time.perf_counter()
        reply = self._reply_spec.views(self._call(self._request))
        self.queued_s += max(time.perf_counter() - tick - float(reply["served_s"][0]), 0.0)
        return reply

    def act(
        self, obs: np.ndarray, sampling: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if "sampling" in self._fields:  # a text env's rows' (envs.text.row_sampling)
            self._fields["sampling"][...] = (
                default_sampling(obs.shape[0]) if sampling is None else sampling
            )
        reply = self._ask(INFERENCE_ACT, obs)
        return reply["action"].copy(), reply["log_prob"].copy(), reply["value"].copy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._ask(INFERENCE_VALUE, obs)["state_value"].copy()
