"""`TextVectorEnv`: dialogue tasks as a Gymnasium vector env of token ids (SAME_STEP autoreset)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.multi_agent.columns import ACTED
from agentenv_jax.envs.spaces import EnvError, TextSpec
from agentenv_jax.envs.text.padding import message_lengths
from agentenv_jax.envs.text.row_sampling import default_sampling
from agentenv_jax.envs.text.tasks import (
    Prompt,
    TaskReply,
    TextTask,
    prompt_messages,
    prompt_text,
    reply_all,
    require_int,
)
from agentenv_jax.envs.text.tokenizer import BYTE_TOKENIZER, Tokenizer

FINISHED_TRANSCRIPTS = 64  # episodes `finished_transcripts` keeps, newest last


def require_text_sizes(
    num_envs: int, context_length: int, response_length: int, group_size: int, shared: str
) -> tuple[int, int, int]:
    """`(context_length, response_length, group_size)` of a vector env of token ids, checked:
    an `EnvError` naming the field otherwise, and where `group_size` does not divide
    `num_envs` (`shared`: what a group of envs shares, for that error)."""
    sizes = (
        require_int("env.kwargs.context_length", context_length, 2),
        require_int("env.kwargs.response_length", response_length, 1),
        require_int("env.kwargs.group_size", group_size, 1),
    )
    if num_envs % sizes[2]:
        raise EnvError(
            f"env.kwargs.group_size = {group_size} must divide the env rank's num_envs = "
            f"{num_envs} (each group of {shared})"
        )
    return sizes


def set_token_spaces(
    env: gym.vector.VectorEnv, vocab_size: int, context_length: int, response_length: int
) -> None:
    """`env`'s spaces as a vector env of token ids: observations `int32 [E, L]` (contexts),
    actions `int32 [E, M]` (messages), ids in `0..vocab_size - 1`."""
    env.single_observation_space = gym.spaces.Box(0, vocab_size - 1, (context_length,), np.int32)
    env.single_action_space = gym.spaces.MultiDiscrete(
        [vocab_size] * response_length, dtype=np.int32
    )
    env.observation_space = gym.vector.utils.batch_space(env.single_observation_space, env.num_envs)
    env.action_space = gym.vector.utils.batch_space(env.single_action_space, env.num_envs)


def group_rngs(seed: int | None, num_envs: int, group_size: int) -> list[np.random.Generator]:
    """Env i's rng, `default_rng(seed + (i // group_size) * group_size)`: a group's envs draw
    alike. Without a seed, one drawn from the OS."""
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    return [np.random.default_rng(seed + (i // group_size) * group_size) for i in range(num_envs)]


def add_final_info(
    info: dict[str, Any],
    ended: np.ndarray,
    final_obs: np.ndarray,
    success: np.ndarray,
    returns: np.ndarray,
    turns: np.ndarray,
) -> None:
    """The ended episodes' last observations and results in `info`, as Gymnasium's SAME_STEP
    vector envs give them: present only on steps where one ended (`ended`, bool `[E]`)."""
    if not ended.any():
        return
    info["final_obs"], info["_final_obs"] = final_obs, ended
    info["final_info"] = {
        "success": success,
        "_success": ended,
        "return": returns,
        "_return": ended,
        "turns": turns,
        "_turns": ended,
    }
    info["_final_info"] = ended


class TextVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of a text task; observations and actions are token ids.

    Observation of env i, `int32 [L]` (`L = context_length`): its dialogue so far,
    `BOS + prompt`, then per turn `message + EOS + reply`, left-padded with PAD so the newest
    token is at index `L - 1`; a dialogue longer than `L` keeps its newest `L` tokens. The
    message is kept as the tokens generated (up to its EOS), while the task is shown their
    decoded text. A prompt that does not
    fit in `L - 1` tokens is an `EnvError` (so a single-turn task never loses its question).

    Action of env i, `int32 [M]` (`M = response_length`): one message, read up to its first
    EOS (all `M` tokens without one). An env whose task is done terminates, one that reached
    the task's `max_turns` without being done truncates; either resets in the same step
    (SAME_STEP), returning the next episode's first observation with the ended one in
    `info["final_obs"]`.

    Envs come in groups of `group_size` consecutive envs whose rngs start alike on a reset,
    so a group draws the same sequence of prompts (several answers to each prompt, as GRPO
    wants); in multi-turn tasks a group's envs may reach their next prompt at different steps,
    unless `round_turns` > 0: then every env starts an episode together every `round_turns`
    steps (episodes are truncated at that many messages), an env whose episode ended waits
    for the round's end, and `info["agent_acted"]` (`bool [E]`) is False on its waiting steps
    (its message is ignored, and the actor marks the transition as padding). A round then holds
    one whole episode of each env, which the group baseline compares across the group.

    A game of several seats whose task plays one seat by a frozen opponent (`opponent_plays`,
    `TextArenaSelfPlayTask` with `opponent: initial`) takes that seat's messages from
    `frozen_opponent(obs [n, L], env_rows [n]) -> tokens [n, M]`, which the env rank sets to
    its first policy; the actions given for those envs are ignored, and their steps are
    padding (`info["agent_acted"]` False, `info["opponent_played"]` True).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(
        self,
        make_task: Callable[[], TextTask],
        num_envs: int,
        context_length: int,
        response_length: int,
        group_size: int = 1,
        tokenizer: Tokenizer = BYTE_TOKENIZER,
        round_turns: int = 0,
    ):
        self.num_envs = require_int("num_envs", num_envs, 1)
        # At least BOS and one more token; each prompt is checked against it on reset.
        self._context_length, self._response_length, self._group_size = require_text_sizes(
            self.num_envs, context_length, response_length, group_size, "envs shares its prompts"
        )
        self.tokenizer = tokenizer
        self._round_turns = require_int("round_turns", round_turns, 0)
        self._round_step = 0  # steps taken in the current round
        self._waiting = np.zeros(self.num_envs, bool)  # ended, waiting for the round's end
        self._tasks = [make_task() for _ in range(self.num_envs)]
        # A game of several seats (`TextTask.seats`) is played by as many envs, each a seat;
        # `bind` tells each copy its env, so the copies of one game share it.
        self.seats = int(getattr(self._tasks[0], "seats", 1))
        self._seated = self.seats > 1
        if self._seated and self.num_envs % (self.seats * self._group_size):
            raise EnvError(
                f"num_envs = {self.num_envs} must be a multiple of {self.seats} seats x "
                f"env.kwargs.group_size = {self._group_size} (each game is played by "
                f"{self.seats} envs, each group of envs compares one seat of its games)"
            )
        for i, task in enumerate(self._tasks):
            bind = getattr(task, "bind", None)
            if bind is not None:
                bind(i, self.num_envs, self._group_size)
        # A seat of each game played by a frozen policy, which the env rank (or `agentenv
        # eval`) hands over as `frozen_opponent`.
        self.needs_frozen_opponent = (
            self._seated
            and callable(getattr(self._tasks[0], "opponent_plays", None))
            and getattr(self._tasks[0], "opponent", "self") != "self"
        )
        self.frozen_opponent: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
        # Tasks whose reward sums named functions report each one's value per step.
        self.reward_names: tuple[str, ...] = tuple(getattr(self._tasks[0], "reward_names", ()))
        self.text_spec: TextSpec = dataclasses.replace(
            tokenizer.text_spec(self._context_length, self._response_length),
            reward_names=self.reward_names,
            episode_round=max(self._round_turns, 1),
        )
        set_token_spaces(self, tokenizer.vocab_size, self._context_length, self._response_length)
        self._rngs: list[np.random.Generator] | None = None  # None until the first reset
        # Env i's dialogue as token ids (all of it; the observation is its newest L), and as
        # text for people: the prompt and (message, reply or None) per turn.
        self._tokens: list[np.ndarray] = [np.zeros(0, np.int32)] * self.num_envs
        self._prompts: list[Prompt] = [""] * self.num_envs
        # Per env: (message, the env's answer or None, the answer's chat role) per turn.
        self._turns: list[list[tuple[str, str | None, str]]] = [[] for _ in range(self.num_envs)]
        self._returns = np.zeros(self.num_envs, np.float64)
        self.finished_transcripts: collections.deque[tuple[str, bool, float]] = collections.deque(
            maxlen=FINISHED_TRANSCRIPTS
        )

    @property
    def max_turns(self) -> int:
        """Agent messages an episode may take (1: a single-turn task)."""
        return max(task.max_turns for task in self._tasks)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode in every env; observations `int32 [E, L]`.

        With a seed, env i's task rng is `default_rng(seed + (i // group_size) * group_size)`.
        Without one, the first reset draws a seed from the OS (groups still share prompts) and
        later ones continue each env's rng. `options` are not used.
        """
        if seed is not None:
            seed = require_int("seed", seed, 0)
        if seed is not None or self._rngs is None:
            self._rngs = group_rngs(seed, self.num_envs, self._group_size)
        for i in range(self.num_envs):
            self._start_episode(i)
        self._round_step = 0
        self._waiting[:] = False
        return self._observations(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One message per env, `actions` `int [E, M]`. Returns observations `int32 [E, L]`,
        rewards `float32 [E]`, terminated and truncated `bool [E]`, and info with
        `success` `bool [E]` (the ended episode met its goal; False where none ended) and
        `response_tokens` `int32 [E]` (message tokens up to and including EOS, M without one),
        and for tasks with `reward_names` (K of them) `reward_terms` `float32 [E, K]` (each
        reward function's value, NaN where it gave none) and `reward_failed` `bool [E, K]`;
        on steps where an episode ended also `final_obs` (object `[E]`, the ended episodes'
        last observations, None elsewhere), `final_info` and their `_` masks."""
        if self._rngs is None:
            raise gym.error.ResetNeeded("TextVectorEnv.step before reset")
        actions = self._check_actions(actions)
        acted = ~self._waiting & self._acting()
        # Whose this step's move is, decided before it (a game that ends swaps the seats).
        by_opponent = self._opponent_seats()
        if by_opponent.any():
            actions = self._opponent_moves(actions, acted & by_opponent)
        eos = self.tokenizer.eos_id
        rewards = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        success = np.zeros(self.num_envs, bool)
        final_obs = np.full(self.num_envs, None, dtype=object)
        returns = np.zeros(self.num_envs, np.float32)
        turns = np.zeros(self.num_envs, np.int32)
        response_tokens = message_lengths(actions, eos, self.tokenizer.pad_id)
        has_eos = (actions == eos).any(axis=1)
        messages = {int(i): self.tokenizer.decode(actions[i]) for i in np.flatnonzero(acted)}
        replies = dict(
            zip(
                messages,
                reply_all(
                    [self._tasks[i] for i in messages],
                    list(messages.values()),
                    [actions[i][: response_tokens[i]] for i in messages],
                ),
                strict=True,
            )
        )
        k = len(self.reward_names)
        reward_terms = np.full((self.num_envs, k), np.nan, np.float32)
        reward_failed = np.zeros((self.num_envs, k), bool)
        ended_now: list[int] = []

        def settle(i: int, reply: TaskReply, message_turn: bool) -> None:
            """Env i's reward, terms and end from `reply`; `message_turn`: it answered a
            message of env i (else it came while env i waited for its turn)."""
            if reply.terms:
                reward_terms[i], reward_failed[i] = reply.terms, reply.failed
            rewards[i] = reply.reward
            self._returns[i] += reply.reward
            terminated[i] = reply.done
            truncated[i] = (
                message_turn and not reply.done and len(self._turns[i]) >= self._turn_limit(i)
            )
            if terminated[i] or truncated[i]:
                self._end(i, reply.success, success, final_obs, returns, turns)
                ended_now.append(i)

        for i, reply in replies.items():
            self._turns[i].append((messages[i], reply.text, reply.role))
            # The message's tokens as generated (EOS included), not its re-encoded text: the
            # next context holds exactly what the policy wrote. A message without EOS gets one
            # as the separator before the reply.
            generated = actions[i][: response_tokens[i]]
            after = (
                # The dialogue up to this message (its reply is the last message).
                self.tokenizer.after_message(self._messages(i)[:-1], reply.text, reply.role)
                if reply.text is not None
                else np.zeros(0, np.int32)
            )
            self._tokens[i] = np.concatenate(
                [self._tokens[i], generated, [] if has_eos[i] else [eos], after]
            ).astype(np.int32)
            settle(i, reply, message_turn=True)
        # Envs that did not act (a seat whose turn it was not) hear what happened meanwhile:
        # another seat's move (an env turn of their dialogue), or the end of their game, on a
        # step that carries their reward and end but no message of theirs (0 tokens).
        for i in np.flatnonzero(~acted & ~self._waiting):
            poll = getattr(self._tasks[i], "poll", None)
            reply = poll() if poll is not None else None
            if reply is None:
                continue
            if reply.text is not None:
                self._deliver(int(i), reply.text, reply.role)
            if reply.done:
                acted[i], response_tokens[i] = True, 0
                settle(int(i), reply, message_turn=False)
        dropped = [i for i, reply in replies.items() if reply.dropped]
        round_over = False
        if self._round_turns:
            self._round_step += 1
            round_over = self._round_step == self._round_turns
        if round_over:
            # Episodes still running at the round's end (a game longer than the round) are
            # truncated; an env that did not act this step ends on a step without a message.
            for i in np.flatnonzero(~self._waiting):
                if i in ended_now:
                    continue
                if not acted[i]:
                    acted[i], response_tokens[i] = True, 0
                truncated[i] = True
                self._end(int(i), False, success, final_obs, returns, turns)
        info: dict[str, Any] = {"success": success, "response_tokens": response_tokens}
        if self._round_turns or dropped or self._seated:
            info[ACTED] = acted.copy()
            info[ACTED][dropped] = False
        if self.needs_frozen_opponent:
            # The opponent's seats are not the policy's to learn from.
            info[ACTED][by_opponent] = False
            info["opponent_played"] = by_opponent
        if round_over:
            # Every env starts the next round's episodes now, as SAME_STEP autoreset does.
            for i in range(self.num_envs):
                self._start_episode(i)
            self._waiting[:] = False
            self._round_step = 0
        elif self._round_turns:
            self._waiting[ended_now] = True
        else:
            # Restarted once every env has heard of its episode's end (a game's seats).
            for i in sorted(ended_now):
                self._start_episode(i)
        if k:
            info["reward_terms"], info["reward_failed"] = reward_terms, reward_failed
        add_final_info(info, terminated | truncated, final_obs, success, returns, turns)
        return self._observations(), rewards, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        """Close every task that holds something open (an env, a server session)."""
        for task in self._tasks:
            close = getattr(task, "close", None)
            if callable(close):
                close()

    def row_sampling(self) -> np.ndarray | None:
        """`float32 [E, 3]` (`envs.text.row_sampling`) for the next step, or None where
        every env takes its message: the policy's own sampling, but one token for an env
        whose message the step ignores (a round's waiting step, the other seat's turn, a
        frozen opponent's seat): it is padding, never trained, and would otherwise be decoded
        to its end, most of a game's generation (TicTacToe against a frozen opponent: 6 % of
        the tokens decoded were moves)."""
        ignored = ~(~self._waiting & self._acting() & ~self._opponent_seats())
        if not ignored.any():
            return None
        sampling = default_sampling(self.num_envs)
        sampling[ignored, 2] = 1
        return sampling

    def _acting(self) -> np.ndarray:
        """bool `[E]`: the envs whose task takes a message now (a seat whose turn it is)."""
        if not self._seated:
            return np.ones(self.num_envs, bool)
        return np.array([getattr(t, "acting", lambda: True)() for t in self._tasks], bool)

    def _opponent_seats(self) -> np.ndarray:
        """bool `[E]`: the envs whose seat the frozen opponent plays in their current game."""
        if not self.needs_frozen_opponent:
            return np.zeros(self.num_envs, bool)
        return np.array([task.opponent_plays() for task in self._tasks], bool)

    def _opponent_moves(self, actions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """`actions` with the messages of envs `rows` (bool `[E]`) written by the frozen
        opponent."""
        if self.frozen_opponent is None:
            raise EnvError(
                "env.kwargs.opponent asks for a frozen opponent, and none was given to play its "
                "seat: the env rank's own policy sets it (topology.inference: env_ranks), as "
                "agentenv eval does"
            )
        index = np.flatnonzero(rows)
        if index.size == 0:
            return actions
        # Only the rows it plays: each observation is a copy of the env's newest tokens.
        obs = np.stack([self._observation(i) for i in index])
        moves = self._check_actions(
            self.frozen_opponent(obs, index),
            index.size,
            "TextVectorEnv.frozen_opponent",
            "envs it plays",
        )
        actions = actions.copy()
        actions[index] = moves
        return actions

    def _end(self, i, task_success, success, final_obs, returns, turns) -> None:
        """Record env i's ended episode in the step's outputs and the transcripts."""
        success[i] = task_success
        final_obs[i] = self._observation(i)
        returns[i], turns[i] = self._returns[i], len(self._turns[i])
        self.finished_transcripts.append(
            (self.transcript(i), bool(task_success), float(self._returns[i]))
        )

    def _deliver(self, i: int, text: str, role: str) -> None:
        """Append an env turn to env i's dialogue that came while it waited for its turn:
        after its last message, or, before its first, to its prompt."""
        if not self._turns[i]:
            self._set_prompt(i, f"{prompt_text(self._prompts[i])}\n{text}".strip("\n"))
            return
        message, _, _ = self._turns[i][-1]
        self._turns[i][-1] = (message, text, role)
        after = self.tokenizer.after_message(self._messages(i)[:-1], text, role)
        self._tokens[i] = np.concatenate([self._tokens[i], after]).astype(np.int32)

    def _turn_limit(self, i: int) -> int:
        """Messages env i's episode may take: its task's, and at most a round's."""
        limit = self._tasks[i].max_turns
        return min(limit, self._round_turns) if self._round_turns else limit

    def transcript(self, i: int) -> str:
        """Env i's current episode so far for people: the prompt, then `agent: ...` and
        `env: ...` (or `tool: ...`) lines."""
        lines = [prompt_text(self._prompts[i])]
        for message, reply, role in self._turns[i]:
            lines.append(f"agent: {message}")
            if reply is not None:
                lines.append(f"{'tool' if role == 'tool' else 'env'}: {reply}")
        return "\n".join(lines)

    def _start_episode(self, i: int) -> None:
        """Draw env i's next prompt from its rng and clear its dialogue."""
        assert self._rngs is not None
        self._set_prompt(i, self._tasks[i].reset(self._rngs[i]))
        self._turns[i] = []
        self._returns[i] = 0.0

    def _set_prompt(self, i: int, prompt: Prompt) -> None:
        """Env i's dialogue: `prompt`, checked against the context length."""
        tokens = self.tokenizer.dialogue_start(prompt)
        if tokens.size > self._context_length - 1:
            raise EnvError(
                f"env.kwargs.context_length = {self._context_length} is too short for the "
                f"prompt: {tokens.size} tokens (BOS included) need a context_length of at least "
                f"{tokens.size + 1} (the prompt begins {prompt_text(prompt)[:40]!r})"
            )
        self._tokens[i] = tokens.astype(np.int32)
        self._prompts[i] = prompt

    def _messages(self, i: int) -> list[dict[str, str]]:
        """Env i's dialogue so far as chat messages: the prompt, then each message and reply."""
        messages = prompt_messages(self._prompts[i])
        for message, reply, role in self._turns[i]:
            messages.append({"role": "assistant", "content": message})
            if reply is not None:
                messages.append({"role": role, "content": reply})
        return messages

    def _observation(self, i: int) -> np.ndarray:
        """Env i's newest `L` dialogue tokens, left-padded: `int32 [L]`."""
        obs = np.full(self._context_length, self.tokenizer.pad_id, np.int32)
        tail = self._tokens[i][-self._context_length :]
        obs[self._context_length - tail.size :] = tail
        return obs

    def _observations(self) -> np.ndarray:
        return np.stack([self._observation(i) for i in range(self.num_envs)])

    def _check_actions(
        self,
        actions: np.ndarray,
        rows: int | None = None,
        where: str = "TextVectorEnv.step",
        rows_name: str = "num_envs",
    ) -> np.ndarray:
        """`actions` as `int [rows, M]` token ids (`rows` defaults to E); `EnvError` naming
        `where` they came from for another shape or out-of-vocab ids."""
        actions = np.asarray(actions)
        expected = (self.num_envs if rows is None else rows, self._response_length)
        if actions.shape != expected or not np.issubdtype(actions.dtype, np.integer):
            raise EnvError(
                f"{where}: actions must be ints of shape {expected} ({rows_name}, "
                f"response_length), got {actions.dtype} {actions.shape}"
            )
        vocab = self.tokenizer.vocab_size
        if actions.size and (actions.min() < 0 or actions.max() >= vocab):
            raise EnvError(
                f"{where}: token ids must lie in 0..{vocab - 1}, got values from "
                f"{int(actions.min())} to {int(actions.max())}"
            )
        return actions
