"""The lead learner's Weights & Biases run: the TensorBoard scalars, the resolved config, offline
unless W&B credentials exist. `wandb` is imported only when a run opens."""

from __future__ import annotations

import netrc
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from agentenv_jax.config.errors import ConfigError

if TYPE_CHECKING:
    from agentenv_jax.config.schema import ExperimentConfig

# W&B's API host, whose ~/.netrc entry `wandb login` writes (WANDB_BASE_URL names another server).
DEFAULT_BASE_URL = "https://api.wandb.ai"
# The W&B run id of a run folder, so that a resumed run continues the same W&B run.
RUN_ID_FILE = "agentenv_run_id"


def require_wandb() -> None:
    """`ConfigError` unless wandb (the `wandb` extra) can be imported."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(
            "run.wandb = True is not allowed here: it needs wandb "
            "(pip install 'agentenv_jax[wandb]'), or set run.wandb=false"
        ) from None


def has_credentials(environ: Mapping[str, str], home: Path) -> bool:
    """Whether W&B could log in without asking: `WANDB_API_KEY` is set, or the netrc file
    (`$NETRC`, else `home/.netrc`) has an entry for the API host (`WANDB_BASE_URL`'s)."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname
    path = Path(environ.get("NETRC") or home / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        return False  # no file, or one W&B could not read either
    return entry is not None and bool(entry[2])


def resolve_mode(choice: str, environ: Mapping[str, str], home: Path) -> str:
    """The W&B mode of `run.wandb_mode`: "online" and "offline" as they are; "auto" is the
    `WANDB_MODE` variable when set, else online with credentials and offline without, so that
    a run without them never reaches the network or waits at a login prompt."""
    if choice != "auto":
        return choice
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if has_credentials(environ, home) else "offline"


class WandbLogger:
    """A W&B run named after the run folder, its files in RUN_DIR/wandb, the config attached;
    opened at the first `log` (a run that never starts leaves none) and finished by `close`."""

    def __init__(self, run_dir: Path, name: str, project: str, mode: str, config: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self._name = name
        self._project = project
        self._mode = mode
        self._config = config
        self._run: Any = None

    def _open(self) -> Any:
        import wandb

        folder = self.run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        run = wandb.init(
            project=self._project,
            name=self._name,
            id=run_id,
            resume="allow" if run_id else None,
            dir=str(self.run_dir),
            config=self._config,
            mode=resolve_mode(self._mode, os.environ, Path.home()),
            # NOTE: console capture would wrap this process's stdout/stderr (the progress line,
            # the launcher's log); our own run's init never finishes a run the caller holds.
            settings=wandb.Settings(console="off", reinit="create_new"),
        )
        if run_id is None:
            id_file.write_text(run.id + "\n")
        return run

    def log(self, values: Mapping[str, float], step: int) -> None:
        if self._run is None:
            self._run = self._open()
        # Committed now: W&B otherwise holds a step's row until the next step, and a run that
        # fails before one can finish without its last row.
        self._run.log(dict(values), step=step, commit=True)

    def close(self) -> None:
        if self._run is None:
            return
        # Called from the drivers' `finally`: an exception on its way out marks the run failed.
        failed = sys.exc_info()[0] is not None
        self._run.finish(exit_code=1 if failed else 0)
        self._run = None


def wandb_logger_for(config: ExperimentConfig, run_dir: Path) -> WandbLogger | None:
    """The W&B logger of a named run's lead learner, or None with `run.wandb` off."""
    if not config.run.wandb:
        return None
    from agentenv_jax.config.loading import config_to_dict

    return WandbLogger(
        run_dir,
        str(config.run.name),
        config.run.wandb_project,
        config.run.wandb_mode,
        config_to_dict(config),
    )
