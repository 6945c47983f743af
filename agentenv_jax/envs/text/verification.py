"""Whether an answer states the gold answer's number: Hugging Face's math-verify where it is
installed (`pip install 'agentenv_jax[text]'`: "1/2", "0.5" and "\\frac{1}{2}" are one answer,
"28,080" is 28080), else the two read as decimal numbers and compared.

Both sides are short texts already cut out of the message (`tasks.answer_text`), so a parse
is quick; math-verify's own time limit (a SIGALRM alarm) is kept where it can be, on the main
thread.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from types import ModuleType

from agentenv_jax.envs.text.tasks import parse_number

# math-verify parses each side with sympy: answers longer than this are not numbers.
MAX_ANSWER_CHARS = 200
# The relative tolerance of the plain comparison (math-verify rounds to 6 decimals).
RELATIVE_TOLERANCE = 1e-6
VERIFY_TIMEOUT_S = 5


@functools.cache
def math_verify() -> ModuleType | None:
    """The `math_verify` module, or None where it is not installed."""
    try:
        import math_verify as module
    except ImportError:
        return None
    # Off the main thread math-verify runs without its alarm and says so once; there the
    # caller bounds the time (reward functions run under `rewards.score_completions`' limit).
    for name in ("math_verify.parser", "math_verify.grader"):  # filters act where records start
        logging.getLogger(name).addFilter(
            lambda record: "Timeout is disabled" not in record.getMessage()
        )
    return module


def numbers_match(gold: str, answer: str) -> bool:
    """Whether `answer` is the number `gold` is (both texts, e.g. "28080" and "28,080")."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    module = math_verify()
    if module is None:
        return plain_numbers_match(gold, answer)
    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    parsed_gold = module.parse(gold, parsing_timeout=timeout)
    parsed = module.parse(answer, parsing_timeout=timeout)
    if not parsed_gold or not parsed:
        return plain_numbers_match(gold, answer)
    return bool(module.verify(parsed_gold, parsed, timeout_seconds=timeout))


def plain_numbers_match(gold: str, answer: str) -> bool:
    """Both texts are decimal numbers, equal to `RELATIVE_TOLERANCE`."""
    expected, given = parse_number(gold), parse_number(answer)
    if expected is None or given is None:
        return False
    return math.isclose(expected, given, rel_tol=RELATIVE_TOLERANCE, abs_tol=RELATIVE_TOLERANCE)
