"""`textarena/<game>`: TextArena's single-player games (`GuessTheNumber-v0`, `TowerOfHanoi-v0`,
`Minesweeper-v0`, ...) as multi-turn text tasks, unchanged.

Each copy of the task holds its own game, made by `textarena.make("<game>-raw")`: the game
without TextArena's observation wrappers, whose observations are rendered here as the dialogue
needs them: the prompt is everything the game shows the player before its first move, and each
reply is only what the game said since the player's last move (its own move is already in the
dialogue). The game's own rules judge each message (TextArena reads a move in `[brackets]`); an
invalid move ends the episode as the game decides. The reward is the game's reward for the
player when the game ends (`env.close()`), 0 before; an episode is a success when it reaches
`success_reward` (1). TextArena seeds Python's global `random` at each reset, so an episode's
game follows its rng's seed.

Two-player games are refused at start-up: self-play (both seats played by the policy, or one
by a frozen earlier version) needs env columns that share one game, which is not built yet.
TextArena is the optional extra `pip install 'agentenv_jax[textarena]'`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import TaskReply, require_int

TEXTARENA_PREFIX = "textarena/"
# Turns an episode may take where the game names no limit of its own.
DEFAULT_MAX_TURNS = 64


def import_textarena() -> Any:
    """The `textarena` module; `EnvError` naming the extra when it is missing."""
    try:
        import textarena
    except ImportError as err:
        raise EnvError(
            f"textarena/<game> envs need TextArena ({err}): pip install 'agentenv_jax[textarena]'"
        ) from None
    return textarena


def textarena_games() -> list[str]:
    """Every game id the installed TextArena registers (its `-raw` and wrapper variants left
    out: the adapter takes the raw game itself)."""
    import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    suffixes = ("-raw", "-train")
    return sorted(game for game in ENV_REGISTRY if not game.endswith(suffixes))


def _render(observations: list[tuple[int, str, Any]], player_id: int) -> str:
    """A player's new observations as text: every message but the player's own moves."""
    import textarena

    lines = [
        message
        for sender, message, kind in observations
        if not (sender == player_id and kind == textarena.ObservationType.PLAYER_ACTION)
    ]
    return "\n".join(line.strip("\n") for line in lines)


class TextArenaTask:
    """One TextArena single-player game an episode (see the module docstring)."""

    def __init__(self, game: str, max_turns: int | None = None, success_reward: float = 1.0):
        games = textarena_games()
        if game not in games:
            close = difflib.get_close_matches(game, games, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnvError(
                f"env.id = 'textarena/{game}': no TextArena game {game!r}{hint}; e.g. "
                "GuessTheNumber-v0, TowerOfHanoi-v0, Minesweeper-v0"
            )
        self.game = game
        self.success_reward = float(success_reward)
        probe = self._make()
        try:
            probe.reset(num_players=1, seed=0)
        except AssertionError as err:
            raise EnvError(
                f"env.id = 'textarena/{game}' is not a single-player game ({err}); self-play on "
                "two-player games is not supported yet"
            ) from None
        except Exception as err:
            raise EnvError(
                f"env.id = 'textarena/{game}': the game does not start: {type(err).__name__}: "
                f"{err} (a game whose data is not installed fails so)"
            ) from err
        own_limit = getattr(probe, "max_turns", None)
        if max_turns is None:
            max_turns = own_limit if isinstance(own_limit, int) and own_limit > 0 else None
        self.max_turns = require_int(
            "env.kwargs.max_turns", max_turns if max_turns is not None else DEFAULT_MAX_TURNS, 1
        )
        self.env: Any = None  # this copy's game, made at its first reset

    def _make(self) -> Any:
        import textarena

        try:
            return textarena.make(f"{self.game}-raw")
        except LookupError as err:
            # NLTK's message is a 20-line banner; its resource's name is what matters.
            missing = re.search(r"Resource '?([\w/.-]+)'? not found", str(err))
            name = missing.group(1) if missing else str(err).strip().splitlines()[0]
            raise EnvError(
                f"env.id = 'textarena/{self.game}' needs data that is not installed: NLTK's "
                f"{name!r} (TextArena fetches it from the internet, which runs do not reach; "
                "install it into an nltk_data folder beforehand, or pick another game)"
            ) from None
        except Exception as err:
            raise EnvError(
                f"env.id = 'textarena/{self.game}': making the game failed: "
                f"{type(err).__name__}: {err}"
            ) from err

    def reset(self, rng: np.random.Generator) -> str:
        if self.env is None:
            self.env = self._make()
        self.env.reset(num_players=1, seed=int(rng.integers(2**31)))
        player_id, observations = self.env.get_observation()
        return _render(observations, player_id)

    def reply(self, message: str) -> TaskReply:
        if self.env is None:
            raise RuntimeError("TextArenaTask.reply before reset")
        done, _ = self.env.step(message)
        if done:
            rewards, _ = self.env.close()
            reward = float((rewards or {}).get(0, 0.0))
            return TaskReply(
                text=None, reward=reward, done=True, success=reward >= self.success_reward
            )
        player_id, observations = self.env.get_observation()
        return TaskReply(
            text=_render(observations, player_id), reward=0.0, done=False, success=False
        )
