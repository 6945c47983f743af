"""A language-model policy acting on text envs: one jitted, KV-cached generation per vector
step (`networks.generation`), on an env rank's CPU or on the learner's devices.

Sampling keys are per env row and call, `fold_in(fold_in(PRNGKey(seed), global env index),
call)`, so what an env is answered does not depend on which rows share a batch: an env rank's
own policy and the learner's central server (`learner.inference_server`) draw alike.

The policy also plays a frozen opponent's seats (`frozen_opponent`): with the first parameters
it was given, and keys of rows `OPPONENT_NOISE_ROW + global env index`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.actor.policy import flat_params_on
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.envs.text.padding import context_length_needed
from agentenv_jax.envs.text.row_sampling import default_sampling
from agentenv_jax.networks.generation import (
    continue_decoding,
    decoded,
    decoded_versions,
    start_decoding,
)
from agentenv_jax.networks.language_model import LanguageModel
from agentenv_jax.networks.text_models import text_generate

# Where a frozen opponent's noise rows start: past every env index of a job.
OPPONENT_NOISE_ROW = 1 << 30


class TextPolicy:
    """`ActorPolicy`'s interface for a language model: `act(obs [E, L], sampling=None)`
    generates one message per env, `(tokens [E, M] int32, log_probs [E, M], values [E, M])`,
    each row at its `sampling` (`envs.text.row_sampling`: temperature, top_p, most tokens), the
    log-probs the sampler's; `value(obs)`
    is V of each context `[E]`.

    The noise of a call is `noise_source(...)()`: `int32 [E, 2]` (global env index, call
    number) per row, from which the jitted call derives each row's key.
    """

    def __init__(
        self,
        lm: LanguageModel,
        unravel: Callable[[jax.Array], Any],
        text: TextSpec,
        seed: int,
        env_offset: int,
        num_envs: int,
        device: jax.Device | None = None,
        length_bucket: int = 0,
        generation_slots: int = 0,
        partial_rollout_steps: int = 0,
    ):
        self._device = device or jax.devices("cpu")[0]
        self._params: jax.Array | None = None
        # The first parameters set, kept once a frozen opponent asks for them.
        self._first_params: jax.Array | None = None
        self._keeps_first = False
        self._env_offset, self._num_envs = env_offset, num_envs
        self._own_noise = self.noise_source(env_offset, num_envs)
        # Contexts cut of their all-padding columns (each new length compiles `act` once).
        self._length_bucket, self._pad_id = length_bucket, text.pad_id
        base = jax.random.PRNGKey(seed)
        generate_text = text_generate(lm, text)

        def row_settings(rows, sampling) -> dict:
            """A key per row, from its noise row `(env, call)`, and its sampling as
            `generate` takes it."""
            keys = jax.vmap(
                lambda row: jax.random.fold_in(jax.random.fold_in(base, row[0]), row[1])
            )(rows)
            return dict(
                key=keys,
                temperature=sampling[:, 0],
                top_p=sampling[:, 1],
                # inf (no limit of the row's own) is the response length, before the cast.
                max_new_tokens=jnp.minimum(sampling[:, 2], text.response_length).astype(jnp.int32),
            )

        def act(flat_params, context, rows, sampling):
            # One batched generation with a key per row (not a vmap of one-row generations,
            # whose loop counters would be batched too, making every cache write a scatter).
            out = generate_text(
                unravel(flat_params),
                context,
                **row_settings(rows, sampling),
                slots=generation_slots or None,  # continuous batching, below the call's rows
            )
            # The behaviour log-probs: the sampler's, the policy's own at the default sampling.
            return out.tokens, out.sampler_log_probs, out.values

        def value(flat_params, context):
            return lm.context_value(unravel(flat_params), context, text.pad_id)

        self._act = jax.jit(act)
        self._value = jax.jit(value)

        # Partial rollouts: the same generation decoded `partial_rollout_steps` tokens at a
        # time, the parameters looked for between parts (`between_parts`).
        self._part_steps = partial_rollout_steps
        # Set by the env rank: called between parts, it takes parameters that arrived and
        # returns the version now held.
        self.between_parts: Callable[[], int] | None = None
        self.version = 0  # the version of the parameters held (the env rank sets it)
        # `int32 [E, M]`: the version of the parameters each token of the last `act` was drawn
        # under (-1 after an answer's end).
        self.token_versions: np.ndarray | None = None

        def start(flat_params, context, rows, sampling, version):
            return start_decoding(
                lm,
                unravel(flat_params),
                context,
                response_length=text.response_length,
                pad_id=text.pad_id,
                version=version,
                **row_settings(rows, sampling),
            )

        def proceed(flat_params, state, version):
            state = continue_decoding(
                lm,
                unravel(flat_params),
                state,
                steps=max(partial_rollout_steps, 1),
                pad_id=text.pad_id,
                eos_id=text.eos_id,
                version=version,
            )
            return state, state.step, jnp.all(state.done)

        def finish(state):
            out = decoded(state)
            return out.tokens, out.sampler_log_probs, out.values, decoded_versions(state)

        self._start, self._proceed = jax.jit(start), jax.jit(proceed)
        self._finish = jax.jit(finish)
        self._response_length = text.response_length

    @staticmethod
    def noise_source(env_offset: int, num_envs: int) -> Callable[[], np.ndarray]:
        """The per-call noise of envs `env_offset .. env_offset + num_envs - 1`: their global
        indices and the number of calls made for them so far."""
        rows = np.arange(env_offset, env_offset + num_envs, dtype=np.int32)
        calls = [0]

        def draw() -> np.ndarray:
            out = np.stack([rows, np.full_like(rows, calls[0])], axis=1)
            calls[0] += 1
            return out

        return draw

    @property
    def num_params(self) -> int:
        return 0 if self._params is None else int(self._params.size)

    def set_params(self, flat_params: np.ndarray | jax.Array) -> None:
        self._params = flat_params_on(self._device, flat_params)
        if self._keeps_first and self._first_params is None:
            self._first_params = self._params

    def frozen_opponent(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """`(obs [n, L], env rows [n]) -> tokens [n, M]`: messages of this policy as it was at
        its first `set_params` (on a fresh run, the untrained model), for the seats a frozen
        opponent plays (`TextVectorEnv.frozen_opponent`). Rows are generated in batches of
        half the rank's envs (a two-player game's one seat), or all of them, so that at most
        two shapes compile."""
        self._keeps_first = True
        calls = [0]

        def move(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
            if self._first_params is None:
                raise RuntimeError("TextPolicy.frozen_opponent called before set_params")
            count = rows.size
            half = max(self._num_envs // 2, 1)
            size = half if count <= half else max(self._num_envs, count)
            fill = np.resize(np.arange(count), size)  # the rows again, as padding
            noise = np.stack(
                [OPPONENT_NOISE_ROW + self._env_offset + rows[fill], np.full(size, calls[0])],
                axis=1,
            ).astype(np.int32)
            calls[0] += 1
            tokens, _, _ = self.act_with(obs[fill], noise, self._first_params)
            return tokens[:count]

        return move

    def act_with(
        self,
        obs: np.ndarray,
        noise: np.ndarray,
        params: jax.Array | None = None,
        sampling: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Messages for `obs` with the rows' `noise`, by `params` (default: the current), each
        row sampled at its `sampling` `[E, 3]` (temperature, top_p, most tokens; default 1, 1
        and the response length: the policy's own distribution, whole messages)."""
        if self._length_bucket:  # generate from the columns the contexts use
            obs = obs[
                ..., obs.shape[-1] - context_length_needed(obs, self._pad_id, self._length_bucket) :
            ]
        if sampling is None:
            sampling = default_sampling(obs.shape[0])
        context, sampling = jnp.asarray(obs, jnp.int32), jnp.asarray(sampling, jnp.float32)
        if params is None and self._part_steps and self.between_parts is not None:
            return self._act_in_parts(context, noise, sampling)
        params = self._params if params is None else params
        tokens, log_probs, values = jax.device_get(self._act(params, context, noise, sampling))
        return tokens, log_probs, values

    def _act_in_parts(
        self, context: jax.Array, noise: np.ndarray, sampling: jax.Array
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A partial rollout: the answers decoded `partial_rollout_steps` tokens at a time,
        continuing under whatever parameters `between_parts` took in between."""
        state = self._start(self._params, context, noise, sampling, self.version)
        while True:
            state, step, all_done = self._proceed(self._params, state, self.version)
            if bool(all_done) or int(step) >= self._response_length:
                break
            self.version = self.between_parts()
        tokens, log_probs, values, versions = jax.device_get(self._finish(state))
        self.token_versions = versions
        return tokens, log_probs, values

    def act(
        self, obs: np.ndarray, sampling: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.act_with(obs, self._own_noise(), sampling=sampling)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._value(self._params, jnp.asarray(obs, jnp.int32)))
