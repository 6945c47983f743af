"""Atari games on C++ vector envs: EnvPool's and ALE's own `AtariVectorEnv`, with the standard
Atari pipeline (`env.preset: atari`, docs/atari.md).

The pipeline is the one Machado et al. (2018) describe and CleanRL, Cleanba and EnvPool report
with: each agent step repeats its action for 4 frames and max-pools the last two, the frame is
84x84 grayscale, the last 4 frames are stacked, episodes start with up to 30 no-ops (or use
sticky actions: `repeat_action_probability: 0.25, noop_max: 0`) and are cut at 108 000 frames.
For training only, a lost life ends the episode and rewards are clipped to their sign; the
episode returns reported are the game's own score over whole games.

Both backends are NEXT_STEP vector envs (the step after an episode ended resets it, its action
ignored), which the actor pads. The C++ envs hand over each step's newest frame;
`AtariVectorEnv` stacks the last `env.frame_stack` of them as the network sees images,
`(84, 84, k)` uint8, a new game's stack holding its first frame k times (as Gymnasium's
`FrameStackObservation` and EnvPool's own stacks do), so a segment's stacks can travel as one
frame per step (`buffers.frame_stacks`). It reports each step's score, whether the game ended
and where stacks restart in `info` (`EPISODE_SCORE`, `GAME_OVER`, `STACK_RESTART`): the actor's
episode statistics read the first two instead of the training reward and termination.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from agentenv_jax.envs.spaces import EnvError

# Keys of a step's `info`: the game's unclipped reward `[E]` float64, whether the game (not
# just a life) ended or was cut at the frame limit `[E]` bool, and whether the observation's
# frame stack starts anew (a new game's first: its frame k times) `[E]` bool.
EPISODE_SCORE = "episode_score"
GAME_OVER = "game_over"
STACK_RESTART = "stack_restart"

ATARI_BACKENDS = ("envpool", "ale")
# What `pip install` brings each backend (agentenv_jax[atari] brings both).
_BACKEND_PACKAGES = {"envpool": "envpool", "ale": "ale-py"}
NOOP_ACTION = 0  # action 0 is NOOP in every game's minimal action set


@dataclasses.dataclass(frozen=True)
class AtariSettings:
    """The Atari pipeline's settings (`env.kwargs` overrides any of them by name)."""

    frameskip: int = 4  # frames each agent step repeats its action for (the last two max-pooled)
    repeat_action_probability: float = 0.0  # sticky actions (Machado et al.: 0.25)
    noop_max: int = 30  # up to this many no-op steps after each reset (0 with sticky actions)
    episodic_life: bool = True  # training: a lost life ends the episode (the game goes on)
    reward_clipping: bool = True  # training: rewards clipped to their sign
    max_num_frames_per_episode: int = 108_000  # the game is cut (truncated) after these frames
    img_height: int = 84
    img_width: int = 84
    full_action_space: bool = False  # all 18 actions instead of the game's minimal set
    use_fire_reset: bool = True  # press FIRE after a reset in games that need it to start


def atari_settings(kwargs: dict[str, Any], max_episode_steps: int | None) -> AtariSettings:
    """The pipeline's settings with `env.kwargs` applied; an unknown or ill-typed key is an
    `EnvError` naming it and what is allowed. `env.max_episode_steps` (agent steps) sets the
    frame limit when given."""
    fields = {f.name: f for f in dataclasses.fields(AtariSettings)}
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"env.kwargs.{unknown[0]} is not a setting of the Atari pipeline{hint}; "
            f"allowed: {', '.join(fields)}"
        )
    values: dict[str, Any] = {}
    for name, value in kwargs.items():
        kind = type(getattr(AtariSettings, name))
        if kind is bool and not isinstance(value, bool):
            raise EnvError(f"env.kwargs.{name} = {value!r} is not allowed: expected true or false")
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise EnvError(f"env.kwargs.{name} = {value!r} is not allowed: expected a number")
        values[name] = kind(value)
    settings = AtariSettings(**values)
    if max_episode_steps is not None:
        settings = dataclasses.replace(
            settings, max_num_frames_per_episode=max_episode_steps * settings.frameskip
        )
    checks = (
        ("frameskip", settings.frameskip >= 1, "an integer >= 1"),
        (
            "repeat_action_probability",
            0.0 <= settings.repeat_action_probability < 1.0,
            "a probability in [0, 1)",
        ),
        ("noop_max", settings.noop_max >= 0, "an integer >= 0"),
        ("max_num_frames_per_episode", settings.max_num_frames_per_episode >= 1, "an integer >= 1"),
        ("img_height", settings.img_height >= 8, "an integer >= 8"),
        ("img_width", settings.img_width >= 8, "an integer >= 8"),
    )
    for name, ok, allowed in checks:
        if not ok:
            value = getattr(settings, name)
            raise EnvError(f"env.kwargs.{name} = {value!r} is not allowed: expected {allowed}")
    return settings


# Random and human scores per game, as the Atari-57 literature normalises with (the table of
# Badia et al. 2020, Agent57, from Mnih et al. 2015): (score - random) / (human - random).
_RANDOM_AND_HUMAN = {
    "asterix": (210.0, 8503.3),
    "beam_rider": (363.9, 16926.5),
    "breakout": (1.7, 30.5),
    "enduro": (0.0, 860.5),
    "ms_pacman": (307.3, 6951.6),
    "pong": (-20.7, 14.6),
    "qbert": (163.9, 13455.0),
    "seaquest": (68.4, 42054.7),
    "space_invaders": (148.0, 1668.7),
}


def human_normalized_score(game: str, score: float) -> float:
    """`score` on `game` as a fraction of the way from random to human play (NaN for a game
    outside the table, or no score)."""
    if game not in _RANDOM_AND_HUMAN or score is None:
        return float("nan")
    random, human = _RANDOM_AND_HUMAN[game]
    return (float(score) - random) / (human - random)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _camel(game: str) -> str:
    return "".join(part.capitalize() for part in game.split("_"))


def atari_game(env_id: str) -> str:
    """The ALE ROM id of `env.id`, given as Gymnasium's `ALE/Pong-v5`, EnvPool's `Pong-v5` or the
    ROM id `pong`; an `EnvError` with the closest game if there is no such ROM."""
    name = env_id.removeprefix("ALE/")
    name = re.sub(r"(NoFrameskip)?-v\d+$", "", name)
    game = name if name.islower() else _snake(name)
    games = _known_games()
    if game not in games:
        close = difflib.get_close_matches(game, games, n=1, cutoff=0.6)
        hint = f" (did you mean {_camel(close[0])!r}, ROM {close[0]!r}?)" if close else ""
        raise EnvError(
            f"env.id = {env_id!r} is not an Atari game{hint}: env.preset = 'atari' takes "
            f"'ALE/<Game>-v5', '<Game>-v5' or a ROM id, one of the {len(games)} ROMs ale-py ships"
        )
    return game


def _known_games() -> list[str]:
    try:
        from ale_py.roms import get_all_rom_ids
    except ImportError:
        raise EnvError(
            "env.preset = 'atari' needs ale-py and its ROMs: pip install 'agentenv_jax[atari]'"
        ) from None
    return sorted(get_all_rom_ids())


def check_backend_installed(backend: str) -> None:
    """An `EnvError` naming the package to install if `backend` cannot be imported."""
    module = "envpool" if backend == "envpool" else "ale_py.vector_env"
    try:
        __import__(module)
    except ImportError as err:
        raise EnvError(
            f"env.vectorization = {backend!r} needs the {_BACKEND_PACKAGES[backend]!r} package, "
            f"which is not installed ({err}): pip install 'agentenv_jax[atari]', or use "
            f"another of {', '.join(ATARI_BACKENDS)}"
        ) from None


def default_num_threads(num_envs: int) -> int:
    """Threads of a C++ vector env when `env.num_threads` is 0: one per core, at most one per
    env (the cores this process may run on)."""
    return max(1, min(num_envs, len(os.sched_getaffinity(0))))


class AtariVectorEnv(gym.vector.VectorEnv):
    """`num_envs` games of one env rank on a C++ vector env (`backend`: "envpool" or "ale"),
    stepped by `num_threads` threads, as a NEXT_STEP Gymnasium vector env of
    `(H, W, frame_stack)` uint8 observations.

    The games are `num_splits` groups (`splits`: consecutive rows of every batch), each a C++
    pool of its own stepped asynchronously: `send_split(k, actions)` starts group k's step and
    returns at once, `recv_splits()` waits for every group's and returns one step of all the
    games, so an env rank's policy can act for group k + 1 while the threads step group k.
    `step` sends every group, then receives. The threads are divided among the groups (at
    least one each); game j is seeded `seed + j` whatever the groups.

    Rewards are clipped here, not by the C++ env, so the unclipped score stays at hand. EnvPool
    keeps the game going after a lost life itself; ALE's vector env ends the whole game then, so
    with `ale` a lost life is ended here: the next step (the padding row that follows every end)
    sends NOOP to that game, and what it scores is added to the game's next step."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    reports_score = True  # info carries EPISODE_SCORE and GAME_OVER (the actor's statistics)

    def __init__(
        self,
        game: str,
        backend: str,
        num_envs: int,
        settings: AtariSettings,
        frame_stack: int,
        num_threads: int,
        num_splits: int = 1,
    ):
        check_backend_installed(backend)
        if not 1 <= num_splits <= num_envs:
            raise EnvError(
                f"env.num_splits = {num_splits} is not allowed: expected 1 to the {num_envs} "
                "envs of this env rank (each group steps at least one game)"
            )
        self.game = game
        self.backend = backend
        self.num_envs = num_envs
        self.settings = settings
        self.stacked_frames = frame_stack  # the stack's rule is `buffers.frame_stacks`'
        groups = np.array_split(np.arange(num_envs), num_splits)
        self.splits = tuple(slice(int(rows[0]), int(rows[-1]) + 1) for rows in groups)
        num_threads = num_threads or default_num_threads(num_envs)
        threads = np.array_split(np.arange(num_threads), num_splits)
        self._threads = [
            max(1, min(len(rows), len(part))) for rows, part in zip(groups, threads, strict=True)
        ]
        self._pools: list[Any] = []
        self._seed: int | None = None
        self._make(seed=0)
        height, width = settings.img_height, settings.img_width
        self.single_observation_space = gym.spaces.Box(
            0, 255, (height, width, frame_stack), dtype=np.uint8
        )
        self.single_action_space = gym.spaces.Discrete(self._num_actions)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._life_lost = np.zeros(num_envs, dtype=bool)  # ale: the next step is padding
        self._carried_score = np.zeros(num_envs, dtype=np.float64)
        # The frame stacks, channel-first (a shift moves whole frames), and which games ended
        # on the last step (the next step's frame starts a new game's stack).
        self._stacks = np.zeros((num_envs, frame_stack, height, width), dtype=np.uint8)
        self._game_over = np.zeros(num_envs, dtype=bool)

    def _make(self, seed: int) -> None:
        if self._pools and self._seed == seed:
            return
        self._close_pools()
        self._pools = [
            self._make_pool(rows.stop - rows.start, threads, seed + rows.start)
            for rows, threads in zip(self.splits, self._threads, strict=True)
        ]
        self._seed = seed
        self._num_actions = int(self._pools[0].single_action_space.n)

    def _make_pool(self, num_envs: int, num_threads: int, seed: int) -> Any:
        """One group's C++ pool of `num_envs` games, game i seeded `seed + i` (EnvPool takes
        its seed when made, ALE's vector env at each reset)."""
        s = self.settings
        if self.backend == "envpool":
            import envpool

            return envpool.make(
                f"{_camel(self.game)}-v5",
                env_type="gymnasium",
                num_envs=num_envs,
                batch_size=num_envs,
                num_threads=num_threads,
                seed=seed,
                stack_num=1,
                frame_skip=s.frameskip,
                noop_max=max(s.noop_max, 1),  # EnvPool's 1 is none: it draws from [0, noop_max)
                episodic_life=s.episodic_life,
                reward_clip=False,
                max_episode_steps=max(1, s.max_num_frames_per_episode // s.frameskip),
                img_height=s.img_height,
                img_width=s.img_width,
                repeat_action_probability=s.repeat_action_probability,
                full_action_space=s.full_action_space,
                use_fire_reset=s.use_fire_reset,
            )
        from ale_py.vector_env import AtariVectorEnv as ALEVectorEnv

        return ALEVectorEnv(
            self.game,
            num_envs,
            num_threads=num_threads,
            stack_num=1,
            frameskip=s.frameskip,
            noop_max=s.noop_max,
            episodic_life=False,  # it would reset the whole game on a lost life
            reward_clipping=False,
            max_num_frames_per_episode=s.max_num_frames_per_episode,
            img_height=s.img_height,
            img_width=s.img_width,
            repeat_action_probability=s.repeat_action_probability,
            full_action_space=s.full_action_space,
            use_fire_reset=s.use_fire_reset,
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.backend == "envpool":
            # EnvPool takes its seed when made: a new seed makes the pools anew.
            self._make(seed=0 if seed is None else seed)
            results = [pool.reset() for pool in self._pools]
        else:
            results = [
                pool.reset(seed=None if seed is None else seed + rows.start)
                for pool, rows in zip(self._pools, self.splits, strict=True)
            ]
        self._stacks[...] = np.concatenate([obs for obs, _ in results])
        self._lives[:] = np.concatenate([info["lives"] for _, info in results])
        self._life_lost[:] = False
        self._carried_score[:] = 0.0
        self._game_over[:] = False
        return self._images(), {STACK_RESTART: np.ones(self.num_envs, dtype=bool)}

    def _images(self) -> np.ndarray:
        """The stacks as the network sees images: `[E, H, W, k]` uint8 (a copy)."""
        return np.ascontiguousarray(self._stacks.transpose(0, 2, 3, 1))

    def _push_frames(self, frames: np.ndarray) -> np.ndarray:
        """Each game's stack moved on by its newest frame `frames [E, 1, H, W]`, or started
        anew with it k times after a game over; returns where stacks restarted `[E]`."""
        restart = self._game_over
        self._stacks[:, :-1] = self._stacks[:, 1:]  # (numpy copies overlapping views safely)
        self._stacks[:, -1:] = frames
        if restart.any():
            self._stacks[restart] = frames[restart]
        return restart

    def send_split(self, split: int, actions: np.ndarray) -> None:
        """Start one step of group `split`'s games with `actions [n]` (its rows of a batch);
        returns without waiting for it."""
        rows = self.splits[split]
        actions = np.asarray(actions, dtype=np.int32).reshape(rows.stop - rows.start)
        lost = self._life_lost[rows]
        if lost.any():
            actions = np.where(lost, NOOP_ACTION, actions)
        self._pools[split].send(actions)

    def recv_splits(self):
        """Wait for the step every group was sent (`send_split`) and return it for all the
        games, as `step` does."""
        parts = [_in_env_order(*pool.recv()) for pool in self._pools]
        obs, reward, terminated, truncated = (
            np.concatenate([part[i] for part in parts]) for i in range(4)
        )
        info = {
            key: np.concatenate([part[4][key] for part in parts])
            for key in ("lives", "terminated")
            if key in parts[0][4]
        }
        return self._outcome(obs, reward, terminated, truncated, info)

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions).reshape(self.num_envs)
        for split, rows in enumerate(self.splits):
            self.send_split(split, actions[rows])
        return self.recv_splits()

    def _outcome(self, frames, reward, terminated, truncated, info):
        """One step of all the games as the actor reads it: the frame stacks, the training
        reward (clipped), terminations at lost lives, and the game's score and end and where
        stacks restarted in `info`."""
        restart = self._push_frames(np.asarray(frames))
        score = np.asarray(reward, dtype=np.float64)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        lives = np.asarray(info["lives"], dtype=np.int64)
        if self.backend == "envpool":
            game_over = np.asarray(info["terminated"], dtype=bool) | truncated
        else:
            game_over = terminated | truncated
            padding = self._life_lost
            score = score + self._carried_score
            self._carried_score = np.where(padding, score, 0.0)
            score = np.where(padding, 0.0, score)
            lost = (lives < self._lives) & ~game_over & ~padding
            self._life_lost = lost if self.settings.episodic_life else np.zeros_like(lost)
            terminated = terminated | self._life_lost
        self._lives = lives
        self._game_over = game_over
        train_reward = np.sign(score) if self.settings.reward_clipping else score
        step_info = {
            EPISODE_SCORE: score,
            GAME_OVER: game_over,
            STACK_RESTART: restart,
            "lives": lives,
        }
        return self._images(), train_reward.astype(np.float32), terminated, truncated, step_info

    def _close_pools(self) -> None:
        for pool in self._pools:
            pool.close()
        self._pools = []

    def close(self, **kwargs: Any) -> None:
        self._close_pools()


def _in_env_order(obs, reward, terminated, truncated, info):
    """A C++ pool's step in the order of its games: the pool returns its batch in the order
    the games finished."""
    order = info.get("env_id")
    if order is None or not (np.diff(order) < 0).any():
        return obs, reward, terminated, truncated, info
    rank = np.argsort(order)
    info = {k: v[rank] if np.ndim(v) else v for k, v in info.items()}
    return obs[rank], reward[rank], terminated[rank], truncated[rank], info


def make_atari_vector_env(
    env_id: str,
    backend: str,
    num_envs: int,
    kwargs: dict[str, Any],
    max_episode_steps: int | None,
    frame_stack: int,
    num_threads: int,
    num_splits: int = 1,
) -> AtariVectorEnv:
    """The vector env of one env rank for `env.preset: atari` (an `EnvError` naming the field
    for an unknown game, setting, backend or number of groups)."""
    if backend not in ATARI_BACKENDS:
        raise EnvError(
            f"env.preset = 'atari' runs on a C++ vector env: env.vectorization = {backend!r} is "
            f"not allowed, expected one of {', '.join(ATARI_BACKENDS)}"
        )
    game = atari_game(env_id)
    settings = atari_settings(kwargs, max_episode_steps)
    check_backend_installed(backend)
    try:
        return AtariVectorEnv(
            game, backend, num_envs, settings, frame_stack, num_threads, num_splits
        )
    except EnvError:
        raise
    except Exception as err:
        raise EnvError(
            f"env.id = {env_id!r} on env.vectorization = {backend!r}: making the vector env "
            f"failed: {type(err).__name__}: {err}"
        ) from err
