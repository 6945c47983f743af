"""conftest's `require_reference`: a reference the tests check against (torch, transformers)
that does not import skips here, fails under CI, and the reference tests take theirs through
it."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO, require_reference

MISSING = "agentenv_no_such_reference_module"


def _assert_stops_with(outcome: type[BaseException]) -> None:
    """`require_reference(MISSING)` ends the test with `outcome` (a skip or a failure): caught
    whatever it raises, so that a skip where a failure is due fails this test, not skips it."""
    with pytest.raises(BaseException) as raised:
        require_reference(MISSING)
    assert raised.type is outcome, raised.value
    assert f"the reference '{MISSING}' does not import" in str(raised.value)


@pytest.mark.parametrize("ci", [None, "false", "1"])
def test_a_missing_reference_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    _assert_stops_with(pytest.skip.Exception)


def test_a_missing_reference_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    _assert_stops_with(pytest.fail.Exception)


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_reference_that_imports_is_returned(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert require_reference("json") is json


def test_no_test_skips_on_torch_or_transformers_by_itself():
    found = [
        f"{path.name}: {match.group(0)}"
        for path in sorted((REPO / "tests").glob("*.py"))
        for match in re.finditer(
            r"importorskip\(\s*[\"'](torch|transformers)[\"']", path.read_text()
        )
    ]
    assert found == [], found
