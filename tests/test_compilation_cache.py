"""JAX's persistent compilation cache, on by default: a second identical run compiles nothing
new; `run.compilation_cache: false` leaves no cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE, cache_folder

from conftest import agentenv_command, run_command, settings

TINY = ("run.total_env_steps=512", "run.progress=false", "env.global_num_envs=4")


def _train(tmp_path: Path, cache: Path, name: str, *overrides: str) -> dict:
    proc = run_command(
        [
            *agentenv_command("train", "cartpole_ppo"),
            *settings(*TINY, "run.run_dir=runs", f"run.name={name}", *overrides),
        ],
        timeout=180,
        cwd=tmp_path,
        extra_env={CACHE_DIR_VARIABLE: str(cache)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "runs" / name / "summary.json").read_text())


def _entries(cache: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in cache.iterdir()}


@pytest.mark.slow
def test_a_second_identical_run_compiles_nothing_new(tmp_path):
    cache = tmp_path / "cache"
    first = _train(tmp_path, cache, "first")
    assert first["compiled_programs"] > 0 and first["compile_cache_hits"] == 0
    stored = _entries(cache)
    assert len(stored) >= first["compiled_programs"]  # each program kept

    second = _train(tmp_path, cache, "second")
    assert second["compiled_programs"] == first["compiled_programs"]
    assert second["compile_cache_hits"] == second["compiled_programs"]  # every one fetched
    assert _entries(cache) == stored  # and none added


@pytest.mark.slow
def test_the_cache_can_be_turned_off(tmp_path):
    cache = tmp_path / "cache"
    summary = _train(tmp_path, cache, "uncached", "run.compilation_cache=false")
    assert summary["compiled_programs"] > 0 and summary["compile_cache_hits"] == 0
    assert not cache.exists()


def test_the_cache_folder_is_the_runs_then_the_variables_then_the_users(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder(None) == tmp_path / "xdg" / "agentenv_jax" / "jax"
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path / "env"))
    assert cache_folder(None) == tmp_path / "env"
    assert cache_folder(str(tmp_path / "run")) == tmp_path / "run"
