"""`agentenv list`: a name column as wide as the longest name, descriptions wrapped to the
terminal's width."""

from __future__ import annotations

from agentenv_jax.config.experiments import (
    describe,
    format_listing,
    shipped_experiments,
    shipped_sweeps,
)
from agentenv_jax.workflow.cli import main


def test_the_name_column_fits_the_longest_name_and_descriptions_wrap_under_it():
    descriptions = {
        "a": "alpha beta gamma delta epsilon zeta eta theta",
        "longer_name": "alpha beta gamma CartPole-v1 zeta",
        "empty": "",
    }
    # 11 columns of names, 2 of space: 27 left for the descriptions.
    assert format_listing(descriptions, 40) == [
        "a            alpha beta gamma delta",
        "             epsilon zeta eta theta",
        "longer_name  alpha beta gamma",
        "             CartPole-v1 zeta",
        "empty",
    ]
    # Too narrow a terminal still leaves the descriptions 20 columns.
    assert format_listing({"name": "one two three four five six"}, 10) == [
        "name  one two three four",
        "      five six",
    ]


def test_agentenv_list_fits_the_terminal_and_keeps_every_description(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "72")
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 72, [line for line in lines if len(line) > 72]
    blank = lines.index("")
    for table, shipped in (
        (lines[:blank], shipped_experiments()),
        (lines[blank + 2 :], shipped_sweeps()),
    ):
        column = max(map(len, shipped)) + 2
        starts = [i for i, line in enumerate(table) if not line.startswith(" ")]
        assert [table[i][:column].rstrip() for i in starts] == list(shipped)
        for (name, path), begin, end in zip(
            shipped.items(), starts, [*starts[1:], len(table)], strict=True
        ):
            entry = table[begin:end]
            assert all(line[:column].rstrip() in ("", name) for line in entry)
            assert " ".join(line[column:] for line in entry) == describe(path)
