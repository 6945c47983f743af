"""The README stays true: its config reference is the schema's, its commands are the CI's."""

from __future__ import annotations

from agentenv_jax.config.reference import config_reference

from conftest import REPO


def test_readme_config_reference_matches_the_schema():
    assert config_reference() in (REPO / "README.md").read_text(), (
        "README's config reference is stale: paste the output of `agentenv config-reference`"
    )


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = "pip install -e '.[test]' && python -m pytest -x"
    assert command in readme
    assert command in (REPO / ".ci" / "run").read_text()
