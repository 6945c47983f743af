"""The experiments that ship with the package, found by name from any folder.

They live in `agentenv_jax/experiments/` (the repository's top-level `experiments/` links
there), so `agentenv train cartpole_ppo` and `load_config("cartpole_ppo")` work in a source
checkout and after a plain `pip install` alike.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Mapping
from pathlib import Path

from agentenv_jax.config.errors import ConfigError

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"


def shipped_experiments() -> dict[str, Path]:
    """Every shipped experiment file by name (its file name without `.yaml`), sorted."""
    return {path.stem: path for path in sorted(EXPERIMENTS_DIR.glob("*.yaml"))}


def describe(path: Path) -> str:
    """The first sentence of an experiment's leading comment: what it trains."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def format_listing(descriptions: Mapping[str, str], width: int) -> list[str]:
    """`agentenv list`'s lines for `descriptions` by name: the names in a column as wide as the
    longest, then two spaces and the description wrapped to `width` columns, its later lines
    indented under its first. The description column is at least 20 wide, even if that
    overflows `width` (narrower, it would hold a word or two a line)."""
    names = max((len(name) for name in descriptions), default=0)
    column = max(width - names - 2, 20)
    lines = []
    for name, text in descriptions.items():
        # Hyphens stay whole: a line break inside `CartPole-v1` or `jax-envs` misleads.
        wrapped = textwrap.wrap(text, column, break_on_hyphens=False) or [""]
        lines.append(f"{name:<{names}}  {wrapped[0]}".rstrip())
        lines += [f"{'':<{names}}  {rest}" for rest in wrapped[1:]]
    return lines


def shipped_sweeps() -> dict[str, Path]:
    """Every shipped sweep file (`experiments/sweeps/`) by name, sorted."""
    return {path.stem: path for path in sorted((EXPERIMENTS_DIR / "sweeps").glob("*.yaml"))}


def _resolve(name_or_path: str | Path, shipped: dict[str, Path], what: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in shipped:
        return shipped[name]
    if path.exists():
        return path  # a FIFO, a directory...: the reader refuses it, saying which
    close = difflib.get_close_matches(name, list(shipped), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        f"{what} file {str(name_or_path)!r} does not exist and is not a shipped {what}"
        f"{hint}; shipped: {', '.join(shipped)} (`agentenv list`)"
    )


def resolve_config_path(name_or_path: str | Path) -> Path:
    """The file of a config argument: an existing file, else a shipped experiment's name
    (`cartpole_ppo`, with or without `.yaml`), else an existing path that is not a regular
    file (for the reader to refuse); `ConfigError` naming both when none."""
    return _resolve(name_or_path, shipped_experiments(), "experiment")


def resolve_sweep_path(name_or_path: str | Path) -> Path:
    """The file of a sweep argument: an existing file, else a shipped sweep's name."""
    return _resolve(name_or_path, shipped_sweeps(), "sweep")
