"""Programming problems generated here, with hidden tests: what `Code-v0` asks the policy.

Each family is a small function to write (filter a list, rotate it, clip its values, count a
letter, a Fibonacci-like sequence, ...) with constants of its own, so the same family asks
many distinct questions: 326 in all, no two with the same text. A
problem's tests are inputs drawn from the episode's rng and the outputs of the reference
solution, which stays on the host: the sandbox sees only the inputs, and the policy's code
is scored by the outputs it prints.

Pure Python and numpy's generator; nothing here runs the policy's code (see `code_tasks`).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable
from typing import Any

import numpy as np

_VOWELS = "aeiou"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One question: the function to write, what it must do, and how to test it."""

    function: str  # its name
    signature: str  # e.g. "xs" (the parameters)
    description: str  # what it returns, with this problem's constants
    reference: Callable[..., Any]  # the solution, on the host only
    make_input: Callable[[np.random.Generator], tuple[Any, ...]]  # one test's arguments

    @property
    def question(self) -> str:
        return (
            f"Write a Python function `{self.function}({self.signature})` that {self.description}"
        )

    def tests(self, rng: np.random.Generator, count: int) -> list[tuple[tuple[Any, ...], Any]]:
        """`count` (arguments, expected output) pairs, the arguments drawn from `rng`."""
        cases = []
        for _ in range(count):
            arguments = self.make_input(rng)
            cases.append((arguments, self.reference(*arguments)))
        return cases


def _int_list(rng: np.random.Generator, low: int = -20, high: int = 20) -> tuple[list[int]]:
    size = int(rng.integers(0, 9))
    return ([int(v) for v in rng.integers(low, high + 1, size)],)


def _word(rng: np.random.Generator) -> tuple[str]:
    size = int(rng.integers(0, 13))
    letters = rng.choice(list(string.ascii_lowercase), size)
    return ("".join(letters),)


def _small_int(rng: np.random.Generator) -> tuple[int]:
    return (int(rng.integers(0, 16)),)


def _multiples(k: int) -> Problem:
    return Problem(
        "sum_multiples",
        "xs",
        f"returns the sum of the numbers in the list `xs` that are divisible by {k}.",
        lambda xs: sum(x for x in xs if x % k == 0),
        _int_list,
    )


def _greater(t: int) -> Problem:
    return Problem(
        "keep_greater",
        "xs",
        f"returns a list of the numbers in the list `xs` that are greater than {t}, in order.",
        lambda xs: [x for x in xs if x > t],
        _int_list,
    )


def _rotate(r: int, left: bool) -> Problem:
    side = "left" if left else "right"

    def rotated(xs: list[int]) -> list[int]:
        if not xs:
            return []
        shift = (r if left else -r) % len(xs)
        return xs[shift:] + xs[:shift]

    return Problem(
        f"rotate_{side}",
        "xs",
        f"returns the list `xs` rotated {r} places to the {side} (an empty list stays empty).",
        rotated,
        _int_list,
    )


def _clip(low: int, high: int) -> Problem:
    return Problem(
        "clip_values",
        "xs",
        f"returns a new list with each number of the list `xs` limited to the range {low} to "
        f"{high}: smaller numbers become {low}, larger ones {high}.",
        lambda xs: [min(max(x, low), high) for x in xs],
        _int_list,
    )


def _count_letter(letter: str) -> Problem:
    def word(rng: np.random.Generator) -> tuple[str]:
        # Words of the letter and three others, so that counts of 0 are not the rule.
        others = [c for c in string.ascii_lowercase if c != letter]
        alphabet = [letter, *rng.choice(others, 3, replace=False)]
        return ("".join(rng.choice(alphabet, int(rng.integers(0, 13)))),)

    return Problem(
        "count_letter",
        "s",
        f"returns how many times the letter '{letter}' occurs in the string `s`.",
        lambda s: s.count(letter),
        word,
    )


def _replace_vowels(mark: str) -> Problem:
    return Problem(
        "replace_vowels",
        "s",
        f"returns the string `s` with every vowel (a, e, i, o, u) replaced by '{mark}'.",
        lambda s: "".join(mark if c in _VOWELS else c for c in s),
        _word,
    )


def _sequence(a: int, b: int) -> Problem:
    def term(n: int) -> int:
        x, y = a, b
        for _ in range(n):
            x, y = y, x + y
        return x

    return Problem(
        "sequence_term",
        "n",
        f"returns term `n` (counting from 0) of the sequence that starts {a}, {b} and where "
        "every later term is the sum of the two before it.",
        term,
        _small_int,
    )


def _window(w: int) -> Problem:
    return Problem(
        "max_window_sum",
        "xs",
        f"returns the largest sum of {w} consecutive numbers of the list `xs`, or 0 if `xs` "
        f"has fewer than {w} numbers.",
        lambda xs: max((sum(xs[i : i + w]) for i in range(len(xs) - w + 1)), default=0),
        _int_list,
    )


def _digit_sum(k: int) -> Problem:
    return Problem(
        "scaled_digit_sum",
        "n",
        f"returns {k} times the sum of the decimal digits of the non-negative integer `n`.",
        lambda n: k * sum(int(d) for d in str(n)),
        lambda rng: (int(rng.integers(0, 100_000)),),
    )


# Every problem, in a fixed order: a family's constants drawn from small ranges.
PROBLEMS: tuple[Problem, ...] = (
    *(_multiples(k) for k in range(2, 10)),
    *(_greater(t) for t in range(-10, 11)),
    *(_rotate(r, left) for r in range(1, 8) for left in (True, False)),
    *(_clip(low, high) for low in range(-10, 1) for high in range(1, 11)),
    *(_count_letter(letter) for letter in string.ascii_lowercase),
    *(_replace_vowels(mark) for mark in "*#_-+!?@$%0123456789XYZ"),
    *(_sequence(a, b) for a in range(0, 10) for b in range(0, 10)),
    *(_window(w) for w in range(2, 6)),
    *(_digit_sum(k) for k in range(1, 21)),
)
