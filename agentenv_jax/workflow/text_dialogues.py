"""Dialogues of a language-model policy on its text env, sampled for people to read.

Play a few episodes with untrained or trained parameters and see what the agent wrote and
what it scored:

    import agentenv_jax as ae
    from agentenv_jax.workflow.text_dialogues import sample_dialogues, trained_params

    before = sample_dialogues(ae.load_config("experiments/arithmetic_ppo.yaml"))
    run = ae.train("arithmetic_ppo")
    after = sample_dialogues(run.config, trained_params(run.run_dir))
    print(after)  # numbered dialogues with ✓/✗; after.accuracy, before.accuracy

The policy generates with the KV cache (`networks.generation.generate`), jitted, on the CPU;
each episode's prompt comes from the evaluation seeds `evaluate` uses (`EVAL_SEED_BASE + ...`),
far from the seeds training draws its prompts from. jax is imported by the functions, not with
this module.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentenv_jax.config.schema import ExperimentConfig


def _visible(line: str) -> str:
    """`line` with its control characters (which an untrained policy writes) escaped, so
    they neither move the cursor nor ring the bell: `\\t`, `\\x1b`, ..."""
    return "".join(
        char if char.isprintable() or char == " " else char.encode("unicode_escape").decode()
        for char in line
    )


@dataclasses.dataclass(frozen=True)
class DialogueSample:
    """Episodes of a policy on a text env, in order of the episodes' seeds.

    Each transcript is the prompt, then an `agent: ...` line per message and an `env: ...` line
    per reply (`TextVectorEnv.transcript`).
    """

    env_id: str
    transcripts: list[str]
    successes: list[bool]  # the episode met its goal (a right answer, the number guessed)
    returns: list[float]  # undiscounted sum of the episode's rewards
    lengths: list[int]  # agent messages of each episode
    accuracy: float  # fraction of episodes that met their goal: the mean of `successes`
    mean_response_tokens: float  # tokens per agent message, EOS included, over all messages

    def format(self, limit: int | None = None) -> str:
        """A header line, then the first `limit` dialogues (all when None), numbered, each
        marked ✓ (goal met) or ✗ with its return, its lines indented."""
        count = len(self.transcripts)
        lines = [
            f"{count} dialogues on {self.env_id}: accuracy {self.accuracy:.3f}, "
            f"{self.mean_response_tokens:.2f} tokens per message"
        ]
        width = len(str(count))
        shown = range(count if limit is None else min(limit, count))
        for i in shown:
            mark = "✓" if self.successes[i] else "✗"
            lines.append(f"{i + 1:>{width}} {mark} return {self.returns[i]:.2f}")
            lines.extend(
                f"{' ' * width}   {_visible(line)}" for line in self.transcripts[i].split("\n")
            )
        if len(shown) < count:
            lines.append(f"... and {count - len(shown)} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def initial_params(config: ExperimentConfig) -> Any:
    """The language model's parameters before training, as the learner of `config` draws them:
    from the first half of `split(PRNGKey(run.seed))` (or `init_from`'s weights)."""
    from agentenv_jax.envs.text import make_text_vector_env
    from agentenv_jax.networks.text_models import text_tokenizer

    tokenizer = text_tokenizer(config.network.language_model)
    env = make_text_vector_env(config.env.id, 1, config.env.kwargs, tokenizer)
    try:
        return _initial_params(config, _language_model(config, env.text_spec))
    finally:
        env.close()


def _language_model(config: ExperimentConfig, text: Any) -> Any:
    """The `LanguageModel` of `config` over the env's `TextSpec` `text`, as the learner's."""
    from agentenv_jax.networks.text_models import language_model_for

    return language_model_for(config.network.language_model, text)


def _initial_params(config: ExperimentConfig, lm: Any) -> Any:
    import jax

    from agentenv_jax.networks.text_models import initial_language_model_params

    # As `learner.loop`: the first key of the split initializes, the second trains.
    init_key, _ = jax.random.split(jax.random.PRNGKey(config.run.seed))
    return initial_language_model_params(lm, config.network.language_model, init_key)


def trained_params(run_dir: str | Path) -> Any:
    """The policy parameters of run `run_dir`'s newest checkpoint (a host pytree, as
    `Run.params` restores it); `CheckpointError` when the run has no checkpoint."""
    from agentenv_jax.checkpoint.run_folder import policy_params
    from agentenv_jax.config.loading import load_config

    return policy_params(run_dir, load_config(Path(run_dir) / "config.yaml"))


def _check_params(params: Any, shapes: Any) -> None:
    """`ValueError` naming the first leaf of `params` that does not fit the model's shapes."""
    import jax

    if jax.tree.structure(params) != jax.tree.structure(shapes):
        raise ValueError(
            "params do not have the language model's tree of parameters (another env's or "
            "network.language_model's?): expected the tree of the config's model"
        )
    for (path, leaf), shape in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(shapes), strict=True
    ):
        if tuple(leaf.shape) != tuple(shape.shape):
            raise ValueError(
                f"params{jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)}; the config's "
                f"language model expects {tuple(shape.shape)}"
            )


def _first_episodes(
    env: Any, act: Callable[[Any], Any], count: int, seed: int
) -> tuple[list[tuple[str, bool, float, int]], int, int]:
    """Reset `env` (a `TextVectorEnv`) with `seed` and step it with `act(obs [E, L]) ->
    actions [E, M]` until envs `0..count - 1` have each ended an episode of the policy's (a
    seat a frozen opponent played is not one: its env's next game is). Returns those first
    episodes' `(transcript, success, return, messages)` in env order, and the tokens and
    messages they hold (tokens EOS included)."""
    import numpy as np

    obs, _ = env.reset(seed=seed)
    running = np.arange(env.num_envs) < count  # envs whose first episode is still going on
    records: dict[int, tuple[str, bool, float, int]] = {}
    tokens, messages = 0, 0
    lengths = np.zeros(env.num_envs, np.int64)
    ended_none = np.zeros(env.num_envs, bool)
    while running.any():
        obs, _, terminated, truncated, info = env.step(act(obs))
        # A seat of a game takes messages on its turns only (the others are padding).
        moved = running & info.get("agent_acted", True) & (info["response_tokens"] > 0)
        lengths[moved] += 1
        tokens += int(info["response_tokens"][moved].sum())
        messages += int(moved.sum())
        ended = np.flatnonzero(terminated | truncated)
        # This step's ended episodes, in env order, are the newest the env keeps.
        kept = list(env.finished_transcripts)
        for i, (transcript, success, episode_return) in zip(
            ended.tolist(), kept[len(kept) - ended.size :], strict=True
        ):
            if running[i] and not info.get("opponent_played", ended_none)[i]:
                records[i] = (transcript, bool(success), float(episode_return), int(lengths[i]))
                running[i] = False
    return [records[i] for i in range(count)], tokens, messages


def pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """The mean over problems of pass@k: the chance that at least one of k answers drawn
    without replacement from a problem's n answers (`successes[problem]`, n >= k) is right,
    `1 - C(n - c, k) / C(n, k)` with c of them right (the unbiased estimator of Chen et al.,
    2021; with n = k, whether any is right)."""
    if k < 1 or any(len(answers) < k for answers in successes):
        raise ValueError(f"pass@{k} needs at least {k} answers per problem")
    values = []
    for answers in successes:
        n, right = len(answers), sum(map(bool, answers))
        values.append(1.0 - math.comb(n - right, k) / math.comb(n, k))
    return float(sum(values) / len(values))


def sample_dialogues(
    config: ExperimentConfig,
    params: Any = None,
    *,
    num_episodes: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
) -> DialogueSample:
    """`num_episodes` episodes of `config`'s text env played by its language model with
    `params` (None: `initial_params(config)`, the untrained policy).

    Envs step together in rounds of up to 64; each env counts its first episode of a round
    only, so episodes that end sooner are not over-represented. Episode `j`'s prompt is drawn
    from the env seed `EVAL_SEED_BASE + seed * num_episodes + j` (with `env.kwargs.group_size`
    > 1, each group shares its first env's), and its messages are sampled at `temperature`
    with keys from `PRNGKey(seed)`: the same arguments give the same dialogues.
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes = {num_episodes!r}: expected an integer >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature = {temperature!r}: expected a number > 0")

    import jax
    import jax.numpy as jnp
    import numpy as np

    from agentenv_jax.envs.factory import EVAL_SEED_BASE
    from agentenv_jax.envs.text import make_text_vector_env
    from agentenv_jax.envs.text.padding import context_length_needed
    from agentenv_jax.envs.text.registry import text_env_seats
    from agentenv_jax.envs.text.vector_env import FINISHED_TRANSCRIPTS
    from agentenv_jax.networks.text_models import text_generate, text_tokenizer

    group_size = config.env.kwargs.get("group_size", 1)
    if not isinstance(group_size, int) or group_size < 1:
        group_size = 1  # the env names the bad value
    if group_size > FINISHED_TRANSCRIPTS:
        raise ValueError(
            f"env.kwargs.group_size = {group_size}: sample_dialogues steps at most "
            f"{FINISHED_TRANSCRIPTS} envs together (a whole group at a time)"
        )
    # A whole number of groups (of whole games: a two-player game's seats are two envs), as
    # `TextVectorEnv` requires, and no more envs than it keeps transcripts of (a step's ended
    # episodes are read from `finished_transcripts`).
    unit = group_size * text_env_seats(config.env.id)
    wanted = -(-min(num_episodes, FINISHED_TRANSCRIPTS) // unit) * unit
    batch = min(wanted, FINISHED_TRANSCRIPTS // unit * unit)
    cpu = jax.devices("cpu")[0]
    tokenizer = text_tokenizer(config.network.language_model)
    env = make_text_vector_env(config.env.id, batch, config.env.kwargs, tokenizer)
    try:
        text = env.text_spec
        lm = _language_model(config, text)
        if params is None:
            params = _initial_params(config, lm)
        _check_params(params, lm.param_shapes())
        with jax.default_device(cpu):
            params = jax.device_put(params, cpu)
            generate_fn = jax.jit(text_generate(lm, text))
            # Generated from the columns the contexts use, rounded up to `length_bucket`, as the
            # actor does: positions count from a row's first token, so the messages are the
            # same, and a long context's left padding is not computed (a TicTacToe game's
            # 768 columns hold ~300 tokens on its first moves).
            bucket = getattr(config.algorithm, "length_bucket", 0)

            def used_columns(obs: np.ndarray) -> np.ndarray:
                if not bucket:
                    return obs
                return obs[..., obs.shape[-1] - context_length_needed(obs, text.pad_id, bucket) :]

            keys = iter(
                jax.random.fold_in(jax.random.PRNGKey(seed), call) for call in itertools.count()
            )

            def act(obs: np.ndarray) -> np.ndarray:
                context = jnp.asarray(used_columns(obs), jnp.int32)
                out = generate_fn(params, context, next(keys), temperature=temperature)
                return np.asarray(out.tokens)

            if env.needs_frozen_opponent:
                # The other seat's player: the untrained model, as a fresh run's env ranks
                # keep it; its own keys, its rows padded to the whole batch (one shape).
                opponent = jax.device_put(_initial_params(config, lm), cpu)
                opponent_keys = iter(
                    jax.random.fold_in(jax.random.PRNGKey(seed + 1), call)
                    for call in itertools.count()
                )

                def opponent_move(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
                    fill = np.resize(np.arange(rows.size), env.num_envs)
                    context = jnp.asarray(used_columns(obs[fill]), jnp.int32)
                    out = generate_fn(
                        opponent, context, next(opponent_keys), temperature=temperature
                    )
                    return np.asarray(out.tokens)[: rows.size]

                env.frozen_opponent = opponent_move

            episodes: list[tuple[str, bool, float, int]] = []
            tokens, messages = 0, 0
            for first in range(0, num_episodes, batch):
                count = min(batch, num_episodes - first)
                reset_seed = EVAL_SEED_BASE + seed * num_episodes + first
                records, round_tokens, round_messages = _first_episodes(env, act, count, reset_seed)
                episodes += records
                tokens += round_tokens
                messages += round_messages
    finally:
        env.close()
    return DialogueSample(
        env_id=config.env.id,
        transcripts=[episode[0] for episode in episodes],
        successes=[episode[1] for episode in episodes],
        returns=[episode[2] for episode in episodes],
        lengths=[episode[3] for episode in episodes],
        accuracy=float(np.mean([episode[1] for episode in episodes])),
        mean_response_tokens=tokens / messages,
    )
