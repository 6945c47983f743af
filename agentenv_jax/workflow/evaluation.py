"""Evaluate a saved policy: a run's checkpoint, played on fresh env seeds, one episode at a time.

`evaluate(run_dir)` reads the run's `config.yaml` and a checkpoint (the newest by default),
rebuilds the policy the run trained (with its observation statistics when the run normalized
observations), and plays `episodes` episodes in a single env, acting deterministically (the
distribution's mode; SAC: `tanh` of the mean) unless asked to sample. Env seeds start at
`EVAL_SEED_BASE`, far from the seeds training uses (`seed * 1_000_003 + env index`).
With `video_dir`, the env renders `rgb_array` frames and Gymnasium's `RecordVideo` writes one
MP4 per episode there (`pip install 'agentenv_jax[video]'`: moviepy, and pygame for the
classic-control envs' rendering). A text env's episodes are dialogues (`text_dialogues`): the
evaluation keeps them and their accuracy; deterministic play decodes (nearly) greedily. A run
with `env.backend: jax` plays its gymnax env instead (`jax_evaluation`; no videos). An Atari
run (`env.preset: atari`) plays whole games on its C++ vector env, scored by the game.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agentenv_jax.checkpoint.run_folder import restore_kept
from agentenv_jax.checkpoint.store import CheckpointError
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.config.schema import ExperimentConfig, SACConfig
from agentenv_jax.envs.atari import EPISODE_SCORE, GAME_OVER
from agentenv_jax.envs.factory import (
    EVAL_SEED_BASE,
    EnvError,
    EnvSpaces,
    describe_spaces,
    make_vector_env,
    resolve_env_factory,
    vector_env_spaces,
)
from agentenv_jax.envs.multi_agent.registry import is_multi_agent
from agentenv_jax.envs.text.reasoning_gym_tasks import TASK_SPLITS
from agentenv_jax.envs.text.registry import has_splits, is_text_env
from agentenv_jax.envs.text.vector_env import FINISHED_TRANSCRIPTS
from agentenv_jax.metrics.compilation import use_persistent_cache


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The returns and lengths of the evaluation episodes of one checkpoint."""

    run_dir: Path
    checkpoint: int  # the update the checkpoint was written at
    deterministic: bool
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    videos: tuple[Path, ...] = ()  # one MP4 per episode, with `video_dir`
    # Text envs: the episodes' dialogues, successes and accuracy (`text_dialogues`).
    dialogues: Any = None
    # Text envs with `pass_at` = k: (k, pass@k over the problems), each answered k times.
    pass_at: tuple[int, float] | None = None

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def describe(self) -> str:
        mode = "deterministic" if self.deterministic else "sampled actions"
        return (
            f"eval {self.run_dir}  checkpoint {self.checkpoint}  {len(self.returns)} episodes "
            f"({mode})  return {self.mean:.2f} ± {self.std:.2f}  "
            f"length {np.mean(self.lengths):.1f}"
            + (f"\nvideos     {len(self.videos)} in {self.videos[0].parent}" if self.videos else "")
            + (f"  accuracy {self.dialogues.accuracy:.3f}" if self.dialogues is not None else "")
            + (
                f"  pass@{self.pass_at[0]} {self.pass_at[1]:.3f} over "
                f"{len(self.returns) // self.pass_at[0]} problems"
                if self.pass_at is not None
                else ""
            )
        )


def _observe_fn(config: ExperimentConfig, meta: dict[str, Any], spaces: EnvSpaces) -> Callable:
    """Observations as the policy saw them in training: normalized with the run's statistics."""
    if not config.env.normalize_obs:
        return lambda obs: obs
    from agentenv_jax.envs import normalization as norm

    stats = norm.stats_from_flat(np.asarray(meta["learner"]["obs_stats"]), spaces.obs_dim)
    return lambda obs: norm.normalize_observations(obs, stats, config.env.clip_obs)


def _act_fn(
    config: ExperimentConfig, spaces: EnvSpaces, state: Any, deterministic: bool
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """`act(obs [1, ...], noise [1, d]) -> env action [1, ...]`, jitted."""
    import jax
    import jax.numpy as jnp

    if isinstance(config.algorithm, SACConfig):
        from agentenv_jax.learner.sac_training import sac_networks_for
        from agentenv_jax.networks.sac_networks import (
            deterministic_action,
            sample_squashed_action,
            unit_to_bounds,
        )

        actor_apply = sac_networks_for(config, spaces).actor_apply
        params = state["actor_params"]
        low = jnp.asarray(spaces.action_low, jnp.float32)
        high = jnp.asarray(spaces.action_high, jnp.float32)

        def act_sac(obs: jax.Array, noise: jax.Array) -> jax.Array:
            head = actor_apply(params, obs)
            unit = (
                deterministic_action(head)
                if deterministic
                else sample_squashed_action(head, noise)[0]
            )
            return unit_to_bounds(unit, low, high)  # as the env ranks scale them

        return jax.jit(act_sac)

    from agentenv_jax.networks import action_distribution, actor_critic_for

    _, apply_fn = actor_critic_for(config.network, spaces)
    distribution = action_distribution(spaces.action_kind, spaces.action_nvec)
    params = state["params"]

    def act(obs: jax.Array, noise: jax.Array) -> jax.Array:
        head, _ = apply_fn(params, obs)
        action = distribution.mode(head) if deterministic else distribution.sample(head, noise)
        if spaces.action_kind == "continuous":  # clipped when stepping, as in training
            action = jnp.clip(
                action,
                jnp.asarray(spaces.action_low, jnp.float32),
                jnp.asarray(spaces.action_high, jnp.float32),
            )
        return action

    return jax.jit(act)


def evaluation_env(config: ExperimentConfig, video_dir: Path | None, prefix: str) -> gym.Env:
    """One env as the run made them; with `video_dir`, rendering `rgb_array` frames into one
    MP4 per episode named `PREFIX-episode-N.mp4`. `EnvError` / `ConfigError` say why not."""
    if video_dir is None:
        return resolve_env_factory(config.env)()
    env_id = config.env.id
    # rgb_array frames need no window: keep SDL (pygame's renderer) from looking for a display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    rendering = dataclasses.replace(
        config.env, kwargs={**config.env.kwargs, "render_mode": "rgb_array"}
    )
    try:
        env = resolve_env_factory(rendering)()
    except (TypeError, gym.error.Error) as err:
        raise EnvError(
            f"--video: env.id = {env_id!r} cannot be made with render_mode='rgb_array' ({err})"
        ) from None
    if env.render_mode != "rgb_array":
        modes = env.metadata.get("render_modes", [])
        env.close()
        raise EnvError(
            f"--video: env.id = {env_id!r} does not render rgb_array frames (its render "
            f"modes: {modes}); evaluate without --video"
        )
    from gymnasium.wrappers import RecordVideo

    try:
        return RecordVideo(
            env, str(video_dir), lambda _: True, name_prefix=prefix, disable_logger=True
        )
    except gym.error.DependencyNotInstalled as err:
        env.close()
        raise ConfigError(f"--video: {err}; pip install 'agentenv_jax[video]'") from None


def _noise(rng: np.random.Generator, spaces: EnvSpaces, rows: int) -> np.ndarray:
    """Sampling noise `[rows, action_size]` float32: Gumbel (categorical) or Gaussian."""
    if spaces.action_kind == "continuous":
        return rng.standard_normal((rows, spaces.action_size)).astype(np.float32)
    return rng.gumbel(size=(rows, spaces.action_size)).astype(np.float32)


def _play_vector_env_episodes(
    config: ExperimentConfig,
    meta: dict[str, Any],
    state: Any,
    seeds: list[int],
    deterministic: bool,
    seed: int,
) -> tuple[list[float], list[int]]:
    """Episodes on `seeds` of a vector env of one env (a multi-agent env's agent columns, or an
    Atari game on its C++ vector env), acting with the run's policy: each episode's return and
    length in env steps. A multi-agent return is the team's (rewards summed over agents and
    steps); an Atari episode is a whole game scored by the game (`envs.atari.EPISODE_SCORE`,
    not the clipped training reward), every life of it, as Atari papers evaluate."""
    env_config = config.env
    if env_config.preset == "atari":
        # Lives do not end evaluation episodes: nothing resets between them but the game.
        env_config = dataclasses.replace(
            env_config, kwargs={**env_config.kwargs, "episodic_life": False}
        )
    env = make_vector_env(env_config, 1, config.network.critic)
    scored = bool(getattr(env, "reports_score", False))
    try:
        spaces = vector_env_spaces(config.env.id, env)
        observe = _observe_fn(config, meta, spaces)
        act = _act_fn(config, spaces, state, deterministic)
        rng = np.random.default_rng([seed, 7])
        returns, lengths = [], []
        for episode_seed in seeds:
            obs, _ = env.reset(seed=episode_seed)
            total, steps, ended = 0.0, 0, False
            while not ended:
                action = np.asarray(act(observe(obs), _noise(rng, spaces, env.num_envs)))
                obs, reward, _, _, info = env.step(action)
                steps += 1
                if scored:
                    total += float(info[EPISODE_SCORE][0])
                    ended = bool(info[GAME_OVER][0])
                else:
                    total += float(np.sum(reward))
                    ended = "final_obs" in info  # the env's episode ended (and auto-reset)
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return returns, lengths


def _not_a_run_dir(folder: Path, examples: int = 2) -> str:
    """Why `folder` cannot be evaluated. A sweep folder (its `sweep.yaml`, written when the
    sweep starts) is the likely mistake: name its trials' run folders, which can be."""
    if not (folder / "sweep.yaml").is_file():
        return f"{folder} is not a run directory (it has no config.yaml)"
    trials = folder / "trials"
    runs = sorted(p for p in trials.glob("*") if (p / "config.yaml").is_file())
    head = f"{folder} is a sweep folder, not a run: each of its trials is a run folder in {trials}/"
    if not runs:
        return f"{head}, and none has started yet"
    listed = "; ".join(f"agentenv eval {run}" for run in runs[:examples])
    more = f" (and {len(runs) - examples} more)" if len(runs) > examples else ""
    return f"{head}; evaluate one of them: {listed}{more}"


def with_split(config: ExperimentConfig, split: str) -> ExperimentConfig:
    """`config` with its text task drawing the problems of `split`; `ConfigError` where the
    task has no splits or `split` is not one."""
    if not is_text_env(config.env.id) or not has_splits(config.env.id):
        raise ConfigError(
            "--split is for text tasks with a held-out split (reasoning_gym/<dataset>, "
            f"agentenv_jax/Dataset-v0, skyrl_gym/<env>); env.id = {config.env.id!r} has none"
        )
    if split not in TASK_SPLITS:
        raise ConfigError(
            f"--split = {split!r} is not allowed: expected one of {', '.join(TASK_SPLITS)}"
        )
    kwargs = {**config.env.kwargs, "split": split}
    return dataclasses.replace(config, env=dataclasses.replace(config.env, kwargs=kwargs))


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    checkpoint: int | None = None,
    deterministic: bool = True,
    seed: int = 0,
    video_dir: str | Path | None = None,
    pass_at: int | None = None,
    split: str | None = None,
) -> Evaluation:
    """Play `episodes` episodes with the policy of `run_dir`'s checkpoint `checkpoint` (the
    newest when None) on env seeds `EVAL_SEED_BASE + seed * episodes + i`; with `video_dir`,
    record each as `eval-update<K>-episode-<i>.mp4` there. On a text env, `pass_at` = k
    answers each of the `episodes` problems k times, sampled (temperature 1), and reports
    pass@k beside the accuracy over all the answers. `split` ("train" or "test") chooses the
    problems of a task that has a held-out split (`reasoning_gym/<dataset>`,
    `agentenv_jax/Dataset-v0`, `skyrl_gym/<env>`; default: the run's own)."""
    if episodes < 1:
        raise ConfigError(f"episodes = {episodes!r} is not allowed: expected an integer >= 1")
    if pass_at is not None and not 1 <= pass_at <= FINISHED_TRANSCRIPTS:
        raise ConfigError(
            f"--pass-at = {pass_at!r} is not allowed: expected an integer in "
            f"1..{FINISHED_TRANSCRIPTS} (answers per problem, sampled together)"
        )
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(_not_a_run_dir(run_dir))
    config = load_config(run_dir / "config.yaml")
    if config.env.backend == "jax" and video_dir is not None:
        raise ConfigError("--video is not supported with env.backend = 'jax': evaluate without it")
    if pass_at is not None and not is_text_env(config.env.id):
        raise ConfigError(f"--pass-at is for text envs; env.id = {config.env.id!r} is not one")
    if split is not None:
        config = with_split(config, split)
    use_persistent_cache(config.run.compilation_cache, config.run.compilation_cache_dir)
    step, state, meta = restore_kept(run_dir, config.checkpoint.keep, checkpoint)

    seeds = [EVAL_SEED_BASE + seed * episodes + episode for episode in range(episodes)]
    if config.env.backend == "jax":
        from agentenv_jax.workflow.jax_evaluation import play_jax_episodes

        returns, lengths = play_jax_episodes(config, state["params"], seeds, deterministic)
        return Evaluation(run_dir, int(step), deterministic, tuple(returns), tuple(lengths))
    if is_text_env(config.env.id):
        if video_dir is not None:
            raise ConfigError("--video is not supported for text envs: evaluate without it")
        from agentenv_jax.networks.generation import GREEDY_TEMPERATURE
        from agentenv_jax.workflow.text_dialogues import pass_at_k, sample_dialogues

        answers = 1 if pass_at is None else pass_at
        if pass_at is not None:
            # Each problem answered `pass_at` times, sampled: a group of envs sharing its prompt.
            kwargs = {**config.env.kwargs, "group_size": pass_at}
            config = dataclasses.replace(config, env=dataclasses.replace(config.env, kwargs=kwargs))
            deterministic = False
        # Deterministic: (nearly) greedy decoding; the Gumbel noise of sampling is kept.
        sample = sample_dialogues(
            config,
            state["params"],
            num_episodes=episodes * answers,
            seed=seed,
            temperature=GREEDY_TEMPERATURE if deterministic else 1.0,
        )
        passed = None
        if pass_at is not None:
            by_problem = [
                sample.successes[i : i + pass_at] for i in range(0, episodes * pass_at, pass_at)
            ]
            passed = (pass_at, pass_at_k(by_problem, pass_at))
        return Evaluation(
            run_dir,
            int(step),
            deterministic,
            tuple(sample.returns),
            tuple(sample.lengths),
            dialogues=sample,
            pass_at=passed,
        )
    if is_multi_agent(config.env.id) or config.env.preset == "atari":
        if video_dir is not None:
            kind = "Atari games" if config.env.preset == "atari" else "multi-agent envs"
            raise ConfigError(f"--video is not supported for {kind}: evaluate without it")
        returns, lengths = _play_vector_env_episodes(
            config, meta, state, seeds, deterministic, seed
        )
        return Evaluation(run_dir, int(step), deterministic, tuple(returns), tuple(lengths))
    prefix = f"eval-update{step}"
    env = evaluation_env(config, None if video_dir is None else Path(video_dir), prefix)
    try:
        spaces = describe_spaces(config.env.id, env.observation_space, env.action_space)
        observe = _observe_fn(config, meta, spaces)
        act = _act_fn(config, spaces, state, deterministic)
        rng = np.random.default_rng([seed, 7])
        returns, lengths = [], []
        for episode in range(episodes):
            obs, _ = env.reset(seed=seeds[episode])
            total, steps, done = 0.0, 0, False
            while not done:
                batch = observe(np.asarray(obs, np.float32)[None])
                action = np.asarray(act(batch, _noise(rng, spaces, 1)))[0]
                if spaces.action_kind == "discrete":
                    action = int(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(steps)
    except gym.error.DependencyNotInstalled as err:  # the env's renderer (pygame, ...)
        raise ConfigError(f"--video: {err}; pip install 'agentenv_jax[video]'") from None
    finally:
        env.close()  # RecordVideo writes the last episode's file here
    videos = (
        ()
        if video_dir is None
        else tuple(Path(video_dir) / f"{prefix}-episode-{i}.mp4" for i in range(episodes))
    )
    return Evaluation(run_dir, int(step), deterministic, tuple(returns), tuple(lengths), videos)
