"""The README stays true: its config reference is the schema's, its commands are the CI's, its
sample output is the program's."""

from __future__ import annotations

import io
import re

from agentenv_jax.config.reference import config_reference
from agentenv_jax.metrics.logger import ProgressLine
from agentenv_jax.metrics.summary import format_summary

from conftest import REPO


def test_readme_config_reference_matches_the_schema():
    assert config_reference() in (REPO / "README.md").read_text(), (
        "README's config reference is stale: paste the output of `agentenv config-reference`"
    )


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = "pip install -e '.[mpich,test]' && python -m pytest -x"
    assert command in readme
    assert command in (REPO / ".ci" / "run").read_text()


def _shape(line: str) -> str:
    """A line with every number made `#` and runs of spaces made one: its format."""
    return re.sub(r"\s+", " ", re.sub(r"\d[\d,.]*", "#", line)).strip()


def test_readme_sample_output_has_the_programs_format():
    readme = (REPO / "README.md").read_text()
    sample = readme.split("The quick-start job, in a log file:\n\n```\n", 1)[1].split("```")[0]
    stream = io.StringIO()
    times = iter([0.0, 7.0])
    progress = ProgressLine(100_000, True, 5.0, stream, clock=lambda: next(times))
    extra = {"episode_return_mean": 500.0, "policy_lag_mean": 0.0, "steps_per_s": 16_653.0}
    progress.update({"update": 1, "env_steps": 256} | extra, force=True)
    progress.update({"update": 391, "env_steps": 100_096} | extra, force=True)
    summary = {
        "run_dir": "runs/CartPole-v1-ppo-20261130-120000",
        "topology": "1 learner + 1 env rank(s), 8 envs, 1 learner device(s)",
        "updates": 391,
        "env_steps": 100_096,
        "episodes": 355,
        "episode_return_mean": 500.0,
        "wall_s": 7.4,
        "steps_per_s": 13_446.0,
        "steps_per_s_after_first_update": 27_000.0,
        "compile_s": 1.9,
        "accounting": {
            "produced": 100_096,
            "sent": 100_096,
            "unsent": 0,
            "received": 100_096,
            "trained": 100_096,
            "late": 0,
            "reconciles": True,
        },
    }
    program = stream.getvalue() + format_summary(summary)
    assert {_shape(x) for x in sample.splitlines()} == {_shape(x) for x in program.splitlines()}
