"""`AgentVectorEnv`: agent programs, written against the `openai` client, as a vector env whose
steps are their model calls.

`env.id: agent` with `env.kwargs.agent: mypackage.agents:solve` names an async function
`solve(client, row) -> reward` (or `(reward, per-call rewards)`): `client` is an
`openai.AsyncOpenAI` pointed at this env's endpoint, `row` a dict from the dataset file
(`env.kwargs.path`, read as `agentenv_jax/Dataset-v0` reads it) or from a generator
(`env.kwargs.rows: mypackage.rows:draw`, called as `draw(rng) -> dict`).

Each of the vector env's `num_envs` slots runs one agent run at a time, on one asyncio loop
in its own thread. A model call is an HTTP request to the endpoint (`server.EndpointServer`,
one per env, on localhost); the endpoint renders its messages with the model's chat template
and holds it. A vector step is one batched generation for all slots: the observation of a slot
is its pending call's prompt ids, its action the completion, which the step hands back to the
waiting request; the step then waits until each slot's agent has made its next call or
returned. So the actor loop, its policy (the env rank's own, or the learner's under central
inference) and the learner train agent programs as they train any text env, and each step
stores the ids the model was fed and sampled, with the behaviour log-probs the policy gave.

A run ends on the step after which its agent returned, with its reward (per-call rewards are
summed into that step: the group baseline compares whole runs). A run that raises, times out
(`agent_timeout_s` between a completion and its next call or return), exceeds
`token_budget` completion tokens or `max_calls` calls ends with `failure_reward`; one that ended
before any model call left no step to learn from and is counted only. Every run is counted in
`accounting` by how it ended.

Under a group baseline (`episode_groups`) slots run in rounds of `max_calls` steps, as
multi-turn text envs do: the `group_size` slots of a group run the same row, a slot whose run
ended waits for the round's end (its steps are padding), and a run still going at the round's
end is cut.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.agent.openai_protocol import (
    CutCompletion,
    OpenAIError,
    SamplingBounds,
    chat_completion,
    context_exceeded,
    cut_completion,
    models_list,
    parse_chat_request,
    parse_completion_request,
    render_messages,
    text_completion,
    with_tools_described,
)
from agentenv_jax.envs.agent.sequences import (
    AnsweredCall,
    ModelCall,
    join_calls,
    prompt_ids_after,
)
from agentenv_jax.envs.agent.server import EndpointServer
from agentenv_jax.envs.import_path import import_object
from agentenv_jax.envs.multi_agent.columns import ACTED
from agentenv_jax.envs.spaces import EnvError, TextSpec
from agentenv_jax.envs.text.dataset_tasks import DatasetRows
from agentenv_jax.envs.text.padding import message_lengths
from agentenv_jax.envs.text.row_sampling import default_sampling
from agentenv_jax.envs.text.tasks import require_int, require_known_kwargs, require_seconds
from agentenv_jax.envs.text.vector_env import (
    FINISHED_TRANSCRIPTS,
    add_final_info,
    group_rngs,
    require_text_sizes,
    set_token_spaces,
)

AGENT_ENV_ID = "agent"
# How a run ended: `finished` (its agent returned a reward), why it failed, or `abandoned`
# (still running when the env was reset or closed).
RUN_ENDINGS = (
    "finished",
    "raised",
    "timed_out",
    "over_budget",
    "over_calls",
    "bad_reward",
    "abandoned",
)
# Runs in a row of one slot that end before any model call, after which the agent is broken.
MAX_RUNS_WITHOUT_CALLS = 16


@dataclasses.dataclass
class AgentAccounting:
    """What the env's agents did. Reconciles: `runs_started` = sum of `ended` + `running`;
    `calls` = the steps that answered a call; a run's calls make its `sequences`."""

    runs_started: int = 0
    ended: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(RUN_ENDINGS, 0))
    runs_without_calls: int = 0  # of the ended, those that made no model call
    calls: int = 0  # completions handed back
    refused: int = 0  # requests answered with an error (bad input, context, unknown key)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sequences: int = 0  # training sequences of the ended runs' calls (`join_calls`)
    sampling_clamped: int = 0  # calls whose temperature or top_p was moved into the ranges
    completions_cut: int = 0  # completions ended early by the request's max_tokens or stop
    tokens_cut: int = 0  # tokens sampled past those ends: never handed back nor trained
    generation_batches: int = 0  # vector steps that generated for at least one call
    largest_batch: int = 0
    last_error: str = ""

    @property
    def running(self) -> int:
        return self.runs_started - sum(self.ended.values())


@dataclasses.dataclass(frozen=True)
class EndedRun:
    """A run that ended: its row, how it ended, its reward and its model calls (the ids fed
    and sampled; `sequences.join_calls` makes them training sequences)."""

    row: dict[str, Any]
    ending: str
    reward: float
    calls: tuple[ModelCall, ...]


@dataclasses.dataclass(eq=False)
class _Call:
    prompt_ids: np.ndarray
    prompt_text: str | None  # None: a `/v1/completions` prompt (no chat history to extend)
    request: Any
    sampling: tuple[float, float]  # the temperature and top_p it is sampled at
    completion: Future = dataclasses.field(default_factory=Future)  # of a CutCompletion


@dataclasses.dataclass(eq=False)
class _Run:
    key: str
    row: dict[str, Any]
    waiting_since: float  # when the agent was started or last handed a completion
    task: Future | None = None  # the agent coroutine's, on the env's asyncio loop
    queue: collections.deque = dataclasses.field(default_factory=collections.deque)
    current: _Call | None = None  # the call this step's observation shows
    calls: list[ModelCall] = dataclasses.field(default_factory=list)
    previous: AnsweredCall | None = None
    generated: dict[str, str] = dataclasses.field(default_factory=dict)  # tool call id -> text
    completion_tokens: int = 0
    ending: str | None = None
    reward: float = 0.0


def _sampling_range(name: str, value: Any, highest: float) -> tuple[float, float]:
    """`env.kwargs.<name>`: `[low, high]` with 0 <= low <= high <= `highest`."""
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        or not 0.0 <= value[0] <= value[1] <= highest
    ):
        raise EnvError(
            f"env.kwargs.{name} = {value!r}: expected [low, high] with 0 <= low <= high <= "
            f"{highest:g}"
        )
    return float(value[0]), float(value[1])


def _agent_function(agent: Any) -> Callable[..., Any]:
    if not isinstance(agent, str):
        raise EnvError(
            f"env.kwargs.agent = {agent!r}: expected 'package.module:function', an async "
            "function (client, row) -> reward"
        )
    function = import_object(agent, "env.kwargs.agent", "an async function (client, row)")
    if not inspect.iscoroutinefunction(function):
        raise EnvError(
            f"env.kwargs.agent = {agent!r} is not an async function: expected `async def "
            f"{agent.rsplit(':', 1)[-1]}(client, row)` returning its reward"
        )
    return function


class AgentVectorEnv(gym.vector.VectorEnv):
    """`num_envs` slots, each running agent runs (see the module). Observations `int32 [E, L]`
    (a slot's pending call's prompt ids, left-padded), actions `int32 [E, M]` (its completion,
    read up to its first EOS); info as `TextVectorEnv` gives it (`success`, `response_tokens`,
    `agent_acted` in rounds, `final_obs` and `final_info` where a run ended)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    # As text envs: one seat per slot, no frozen opponent, one reward (no named terms).
    seats = 1
    needs_frozen_opponent = False
    reward_names: tuple[str, ...] = ()

    def __init__(
        self,
        num_envs: int,
        tokenizer: Any,
        agent: str,
        path: str | None = None,
        rows: str | None = None,
        test_path: str | None = None,
        split: str = "train",
        test_fraction: float = 0.1,
        prompt_column: str = "prompt",
        context_length: int = 1024,
        response_length: int = 256,
        group_size: int = 1,
        max_calls: int = 8,
        token_budget: int | None = None,
        agent_timeout_s: float = 60.0,
        failure_reward: float = 0.0,
        success_reward: float = 1.0,
        model_name: str = "policy",
        temperature_range: Sequence[float] = (1.0, 1.0),
        top_p_range: Sequence[float] = (1.0, 1.0),
        episode_groups: bool = False,
    ):
        self.num_envs = require_int("num_envs", num_envs, 1)
        if getattr(tokenizer, "chat", None) is None:
            raise EnvError(
                "env.id = 'agent' renders its agents' chat messages with the model's chat "
                "template: set network.language_model.pretrained to a model with one (the "
                "byte tokenizer of a from-scratch model has none)"
            )
        self.tokenizer = tokenizer
        # A template that renders `tools` (Qwen's, Llama 3's) shows them its own way; to one
        # that does not (SmolLM2's) the endpoint describes them in a system turn.
        self._template_shows_tools = "tools" in tokenizer.chat.source
        self._agent = _agent_function(agent)
        self._context_length, self._response_length, self._group_size = require_text_sizes(
            self.num_envs, context_length, response_length, group_size, "slots runs the same rows"
        )
        self.max_turns = require_int("env.kwargs.max_calls", max_calls, 1)
        if token_budget is not None:
            token_budget = require_int("env.kwargs.token_budget", token_budget, 1)
        self._token_budget = token_budget
        self._timeout_s = require_seconds("env.kwargs.agent_timeout_s", agent_timeout_s, 86400.0)
        for name, value in (("failure_reward", failure_reward), ("success_reward", success_reward)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise EnvError(f"env.kwargs.{name} = {value!r}: expected a number")
        self._failure_reward, self._success_reward = float(failure_reward), float(success_reward)
        if not isinstance(model_name, str) or not model_name:
            raise EnvError(f"env.kwargs.model_name = {model_name!r}: expected a non-empty string")
        self.model_name = model_name
        self._temperature_range = _sampling_range("temperature_range", temperature_range, 2.0)
        self._top_p_range = _sampling_range("top_p_range", top_p_range, 1.0)
        if (path is None) == (rows is None):
            raise EnvError(
                "env.id = 'agent' takes its rows from a dataset file (env.kwargs.path) or a "
                f"generator (env.kwargs.rows: 'package.module:function'), one of them; got "
                f"path = {path!r}, rows = {rows!r}"
            )
        self._data = (
            DatasetRows(path, test_path, split, test_fraction, prompt_column)
            if path is not None
            else None
        )
        self._draw_row = (
            import_object(rows, "env.kwargs.rows", "a function (rng) -> row dict")
            if rows is not None
            else None
        )
        if self._draw_row is not None:
            takes_split = "split" in inspect.signature(self._draw_row).parameters
            if not takes_split and split != "train":
                raise EnvError(
                    f"env.kwargs.split = {split!r}: the generator env.kwargs.rows = {rows!r} "
                    "takes no split (define it as draw(rng, split) to hold questions out)"
                )
            self._draw_kwargs = {"split": split} if takes_split else {}
        self._round_turns = self.max_turns if episode_groups else 0
        self.bounds = SamplingBounds(self._response_length, self._context_length)
        self.text_spec: TextSpec = dataclasses.replace(
            tokenizer.text_spec(self._context_length, self._response_length),
            episode_round=max(self._round_turns, 1),
        )
        set_token_spaces(self, tokenizer.vocab_size, self._context_length, self._response_length)
        self.accounting = AgentAccounting()
        # The newest ended runs, for people (`agentenv eval --dialogues`) and for inspection.
        self.finished_transcripts: collections.deque[tuple[str, bool, float]] = collections.deque(
            maxlen=FINISHED_TRANSCRIPTS
        )
        self.ended_runs: collections.deque[EndedRun] = collections.deque(
            maxlen=FINISHED_TRANSCRIPTS
        )
        self._changed = threading.Condition()
        self._runs: list[_Run | None] = [None] * self.num_envs
        self._by_key: dict[str, _Run] = {}
        self._serial = 0
        self._without_calls = [0] * self.num_envs
        self._obs = np.full((self.num_envs, self._context_length), tokenizer.pad_id, np.int32)
        self._obs[:, -1] = tokenizer.bos_id
        self._round_step = 0
        self._rngs: list[np.random.Generator] | None = None
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="agent-runs", daemon=True
        )
        self._loop_thread.start()
        self.server = EndpointServer(self._answer)
        self._client = self._make_client()
        self._created = int(time.time())

    # -- the agents' side: runs on the asyncio loop, calls through the endpoint --------------

    def _make_client(self) -> Any:
        try:
            import openai
        except ImportError:
            raise EnvError(
                "env.id = 'agent' gives each agent an openai.AsyncOpenAI client: "
                "pip install 'agentenv_jax[agent]'"
            ) from None

        async def make() -> Any:
            # No retries: a refused call is the agent's to handle, once; the timeout is the
            # env's (a call waits at most for one vector step).
            return openai.AsyncOpenAI(
                base_url=self.server.base_url, api_key="none", max_retries=0, timeout=None
            )

        return asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    def _start_run(self, slot: int) -> None:
        assert self._rngs is not None
        row = self._next_row(self._rngs[slot])
        self._serial += 1
        run = _Run(f"run-{slot}-{self._serial}", row, time.monotonic())
        client = self._client.with_options(api_key=run.key)
        with self._changed:
            self._runs[slot] = run
            self._by_key[run.key] = run
            self.accounting.runs_started += 1
        run.task = asyncio.run_coroutine_threadsafe(self._agent(client, row), self._loop)
        run.task.add_done_callback(lambda task, run=run: self._agent_returned(run, task))

    def _next_row(self, rng: np.random.Generator) -> dict[str, Any]:
        if self._data is not None:
            return dict(self._data.draw(rng)[1])
        assert self._draw_row is not None
        row = self._draw_row(rng, **self._draw_kwargs)
        if not isinstance(row, dict):
            raise EnvError(
                f"env.kwargs.rows gave {type(row).__name__} {row!r}; expected a dict (a row)"
            )
        return row

    def _agent_returned(self, run: _Run, task: Future) -> None:
        """The run's coroutine ended: its reward, or why it failed (on the loop's thread)."""
        with self._changed:
            if run.ending is not None:  # already ended by the env (timed out, cut)
                return
            if task.cancelled():
                run.ending, run.reward = "timed_out", self._failure_reward
            elif (err := task.exception()) is not None:
                run.ending, run.reward = "raised", self._failure_reward
                self._note_error(run, "".join(traceback.format_exception(err)))
            else:
                run.ending, run.reward = self._reward_of(run, task.result())
            self._changed.notify_all()

    def _reward_of(self, run: _Run, result: Any) -> tuple[str, float]:
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], list | tuple):
            values = [result[0], *result[1]]  # (reward, per-call rewards): summed
        else:
            values = [result]
        if all(
            isinstance(v, int | float | np.floating | np.integer)
            and not isinstance(v, bool)
            and math.isfinite(v)
            for v in values
        ):
            return "finished", float(sum(values))
        self._note_error(
            run,
            f"the agent returned {result!r}: expected a finite reward, or (reward, [per-call "
            "rewards])",
        )
        return "bad_reward", self._failure_reward

    def _note_error(self, run: _Run, message: str) -> None:
        if not self.accounting.last_error:  # the first one in full: it is what to fix
            print(
                f"agent env: run {run.key} (row {run.row!r:.200}) failed:\n{message}",
                file=sys.stderr,
                flush=True,
            )
        self.accounting.last_error = message.strip().splitlines()[-1]

    # -- the endpoint: answers in the server's threads ---------------------------------------

    def _answer(self, route: str, api_key: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        if route == "models":
            return 200, models_list(self.model_name, self._created)
        with self._changed:
            run = self._by_key.get(api_key or "")
            self.accounting.refused += run is None
        if run is None:
            raise OpenAIError(
                401,
                "Incorrect API key provided: this endpoint answers the agent runs it started, "
                "each with its own key",
                code="invalid_api_key",
            )
        try:
            call = self._prepare(run, route, body)
        except OpenAIError:
            with self._changed:
                self.accounting.refused += 1
            raise
        with self._changed:
            if run.ending is not None:
                raise OpenAIError(409, "this agent run has ended", code="run_ended")
            run.queue.append(call)
            self._changed.notify_all()
        completion = call.completion.result()  # set by a vector step, or failed as it ended
        return 200, self._response(run, call, completion)

    def _prepare(self, run: _Run, route: str, body: Any) -> _Call:
        tokenizer = self.tokenizer
        if route == "chat":
            request = parse_chat_request(body, self.model_name, self.bounds)
            messages = render_messages(request.messages, run.generated)
            if request.tools and not self._template_shows_tools:
                messages = with_tools_described(messages, request.tools)
            try:
                text = tokenizer.chat.render(messages, True, request.tools or None)
            except Exception as err:  # the template refused the messages (raise_exception)
                raise OpenAIError(400, f"The chat template refused the messages: {err}") from None
            ids = prompt_ids_after(
                run.previous, text, tokenizer.encode, tokenizer.eos_token, tokenizer.eos_id
            )
        else:
            request = parse_completion_request(body, self.model_name, self.bounds)
            text = None
            if isinstance(request.prompt, str):
                ids = list(tokenizer.encode(request.prompt))
            else:
                ids = list(request.prompt)
                if max(ids) >= tokenizer.vocab_size or min(ids) < 0:
                    raise OpenAIError(
                        400,
                        f"'prompt' holds token ids outside 0..{tokenizer.vocab_size - 1}",
                        param="prompt",
                    )
        if len(ids) > self._context_length:
            raise context_exceeded(len(ids), self.bounds)
        asked = (request.temperature, request.top_p)
        (t_low, t_high), (p_low, p_high) = self._temperature_range, self._top_p_range
        sampling = (
            min(max(request.temperature, t_low), t_high),
            min(max(request.top_p, p_low), p_high),
        )
        if sampling != asked:
            with self._changed:
                self.accounting.sampling_clamped += 1
        return _Call(np.asarray(ids, np.int32), text, request, sampling)

    def _response(self, run: _Run, call: _Call, completion: CutCompletion) -> dict[str, Any]:
        text, reason = completion.text, completion.finish_reason
        prompt_tokens, completion_tokens = int(call.prompt_ids.size), len(completion.ids)
        if call.prompt_text is None:  # a `/v1/completions` call
            return text_completion(self.model_name, text, reason, prompt_tokens, completion_tokens)
        response = chat_completion(
            self.model_name,
            text,
            reason,
            prompt_tokens,
            completion_tokens,
            tools_offered=bool(call.request.tools),
        )
        for tool_call in response["choices"][0]["message"].get("tool_calls") or ():
            run.generated[tool_call["id"]] = text
        # The text of every id handed back, a stop string too: a next prompt that extends it
        # extends the ids; one whose history lacks the stop string starts a new sequence.
        run.previous = AnsweredCall(
            call.prompt_text, tuple(call.prompt_ids.tolist()), completion.ids, completion.ids_text
        )
        return response

    def row_sampling(self) -> np.ndarray:
        """`float32 [E, 3]` (`envs.text.row_sampling`): the temperature and top_p each slot's
        pending call is sampled at (its request's, moved into `temperature_range` and
        `top_p_range`) and its request's `max_tokens`, where generation stops the row. A slot
        without a pending call (a round's padding step, never trained) gets one token. The
        actor loop passes it to the policy with the step's observations."""
        sampling = default_sampling(self.num_envs)
        for slot, run in enumerate(self._runs):
            if run is not None and run.current is not None:
                sampling[slot] = (*run.current.sampling, run.current.request.max_tokens)
            else:
                sampling[slot, 2] = 1
        return sampling

    # -- the vector env: one step per batch of calls -----------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """End every run and start new ones; slot i draws rows from
        `default_rng(seed + (i // group_size) * group_size)` (a group runs the same rows)."""
        if seed is not None:
            seed = require_int("seed", seed, 0)
        if seed is not None or self._rngs is None:
            self._rngs = group_rngs(seed, self.num_envs, self._group_size)
        for slot in range(self.num_envs):
            self._end_run(slot, "abandoned")
        self._round_step = 0
        self._begin(list(range(self.num_envs)))
        return self._obs.copy(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Hand each slot's pending call its completion (`actions` `int [E, M]`), wait for the
        agents' next calls or returns, and start new runs where runs ended (see the module)."""
        if self._rngs is None:
            raise gym.error.ResetNeeded("AgentVectorEnv.step before reset")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self._response_length):
            raise EnvError(
                f"AgentVectorEnv.step: actions must be of shape "
                f"{(self.num_envs, self._response_length)}, got {actions.shape}"
            )
        response_tokens = message_lengths(actions, self.tokenizer.eos_id, self.tokenizer.pad_id)
        acted = np.array([run is not None and run.current is not None for run in self._runs])
        served = [int(slot) for slot in np.flatnonzero(acted)]
        for slot in served:
            call = self._runs[slot].current
            sampled = actions[slot, : response_tokens[slot]].tolist()
            completion = cut_completion(
                sampled,
                self.tokenizer.decode,
                self.tokenizer.eos_id,
                call.request.max_tokens,
                call.request.stop,
            )
            # The tokens handed back are those trained: the learner masks the rest.
            response_tokens[slot] = len(completion.ids)
            cut = len(sampled) - len(completion.ids)
            self.accounting.completions_cut += cut > 0
            self.accounting.tokens_cut += cut
            self._deliver(slot, completion)
        self.accounting.generation_batches += bool(served)
        self.accounting.largest_batch = max(self.accounting.largest_batch, len(served))
        self._wait_ready(served)

        rewards = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        success = np.zeros(self.num_envs, bool)
        returns = np.zeros(self.num_envs, np.float32)
        turns = np.zeros(self.num_envs, np.int32)
        final_obs = np.full(self.num_envs, None, dtype=object)
        round_over = False
        if self._round_turns:
            self._round_step += 1
            round_over = self._round_step == self._round_turns
        for slot in served:
            run = self._runs[slot]
            assert run is not None
            over = len(run.calls) >= self.max_turns and (round_over or bool(run.queue))
            if run.ending is None and over:
                self._end_run(slot, "over_calls")
            if run.ending is None:
                continue
            self._end_run(slot, run.ending)  # counted, its coroutine and calls closed
            rewards[slot] = run.reward
            truncated[slot] = run.ending in ("over_calls", "over_budget")
            terminated[slot] = not truncated[slot]
            success[slot] = self._succeeded(run)
            returns[slot], turns[slot] = run.reward, len(run.calls)
            final_obs[slot] = self._obs[slot].copy()
            self._runs[slot] = None
        info: dict[str, Any] = {"success": success, "response_tokens": response_tokens}
        if self._round_turns:
            info[ACTED] = acted
        if round_over:
            self._round_step = 0
            self._begin(list(range(self.num_envs)))
        elif not self._round_turns:
            self._begin([slot for slot in range(self.num_envs) if self._runs[slot] is None])
        add_final_info(info, terminated | truncated, final_obs, success, returns, turns)
        return self._obs.copy(), rewards, terminated, truncated, info

    def _deliver(self, slot: int, completion: CutCompletion) -> None:
        run = self._runs[slot]
        assert run is not None and run.current is not None
        call, run.current = run.current, None
        run.calls.append(ModelCall(tuple(call.prompt_ids.tolist()), completion.ids))
        run.completion_tokens += len(completion.ids)
        self.accounting.calls += 1
        self.accounting.prompt_tokens += int(call.prompt_ids.size)
        self.accounting.completion_tokens += len(completion.ids)
        with self._changed:
            run.waiting_since = time.monotonic()
        call.completion.set_result(completion)
        if self._token_budget is not None and run.completion_tokens > self._token_budget:
            self._end_run(slot, "over_budget")

    def _begin(self, slots: list[int]) -> None:
        """Start runs in `slots` and wait for their first calls; a run that ends without one
        is counted and its slot starts another (in rounds: waits for the round's end)."""
        while slots:
            for slot in slots:
                self._start_run(slot)
            self._wait_ready(slots)
            again = []
            for slot in slots:
                run = self._runs[slot]
                assert run is not None
                if run.current is not None:
                    self._without_calls[slot] = 0
                    continue
                self._end_run(slot, run.ending or "raised")
                self._runs[slot] = None
                self._without_calls[slot] += 1
                if self._without_calls[slot] >= MAX_RUNS_WITHOUT_CALLS:
                    raise EnvError(
                        f"env.kwargs.agent: {self._without_calls[slot]} runs in a row ended "
                        f"without calling the model (the last: {run.ending}; "
                        f"{self.accounting.last_error or 'no error'}); an agent must call "
                        "the client it is given"
                    )
                if not self._round_turns:  # in rounds the slot waits for the next round
                    again.append(slot)
            slots = again

    def _wait_ready(self, slots: list[int]) -> None:
        """Wait until each run in `slots` has a call queued or has ended, ending those whose
        agent took longer than `agent_timeout_s`; a queued call becomes the slot's current
        call and its prompt the slot's observation."""
        with self._changed:
            while True:
                now = time.monotonic()
                pending = []
                for slot in slots:
                    run = self._runs[slot]
                    if run is None or run.ending is not None or run.queue:
                        continue
                    if now - run.waiting_since >= self._timeout_s:
                        self._end_locked(run, "timed_out")
                        continue
                    pending.append(run.waiting_since + self._timeout_s - now)
                if not pending:
                    break
                self._changed.wait(min(pending))
            for slot in slots:
                run = self._runs[slot]
                if run is not None and run.ending is None and run.queue:
                    run.current = run.queue.popleft()
                    ids = run.current.prompt_ids
                    self._obs[slot] = self.tokenizer.pad_id
                    self._obs[slot, self._context_length - ids.size :] = ids

    def _end_run(self, slot: int, ending: str) -> None:
        run = self._runs[slot]
        if run is not None:
            with self._changed:
                self._end_locked(run, ending)

    def _end_locked(self, run: _Run, ending: str) -> None:
        """End `run` as `ending` (a failure: `failure_reward`) unless it has ended; count it,
        cancel its coroutine and fail its calls still waiting."""
        if run.ending is None:
            run.ending, run.reward = ending, self._failure_reward
            if ending == "timed_out":
                self._note_error(run, f"no call or return within {self._timeout_s:g} s")
        if run.key not in self._by_key:
            return
        del self._by_key[run.key]
        self.accounting.ended[run.ending] += 1
        self.accounting.runs_without_calls += not run.calls
        self.accounting.sequences += len(join_calls(run.calls))
        self.ended_runs.append(EndedRun(run.row, run.ending, run.reward, tuple(run.calls)))
        if run.calls:
            transcript = (self._transcript(run), self._succeeded(run), run.reward)
            self.finished_transcripts.append(transcript)
        if run.task is not None:
            run.task.cancel()
        for call in [*run.queue, *([run.current] if run.current else [])]:
            call.completion.set_exception(OpenAIError(409, "this agent run has ended"))
        run.queue.clear()
        run.current = None

    def _succeeded(self, run: _Run) -> bool:
        return run.ending == "finished" and run.reward >= self._success_reward

    def _transcript(self, run: _Run) -> str:
        """A run for people: its row, how it ended, and its last call as the model saw it
        (the chat template's text, special tokens shown)."""
        last = run.calls[-1]
        ids = [*last.prompt_ids, *last.completion_ids]
        text = self.tokenizer.backend.decode(ids, skip_special_tokens=False)
        return f"row: {run.row!r}\nended: {run.ending} (reward {run.reward:g})\n{text}"

    def close_extras(self, **kwargs: Any) -> None:
        for slot in range(self.num_envs):
            self._end_run(slot, "abandoned")
        self.server.close()
        close = getattr(self._client, "close", None)
        if close is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)


def make_agent_vector_env(
    num_envs: int, kwargs: dict[str, Any], tokenizer: Any, episode_groups: bool = False
) -> AgentVectorEnv:
    """`AgentVectorEnv` of `env.kwargs` = `kwargs`; `EnvError` naming an unknown kwarg (with
    the allowed ones) or a missing `agent`."""
    parameters = inspect.signature(AgentVectorEnv).parameters
    allowed = [n for n in parameters if n not in ("num_envs", "tokenizer", "episode_groups")]
    require_known_kwargs(kwargs, allowed, AGENT_ENV_ID)
    if "agent" not in kwargs:
        raise EnvError(
            "env.id = 'agent' needs env.kwargs.agent: 'package.module:function', an async "
            "function (client, row) -> reward"
        )
    return AgentVectorEnv(num_envs, tokenizer, episode_groups=episode_groups, **kwargs)
