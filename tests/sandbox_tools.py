"""A user's tools for the sandbox tests: standard library only, imported inside the sandbox."""

from __future__ import annotations

import os
import time


def busy(expression: str) -> str:
    """Holds the GIL in one call into C for far longer than any time limit."""
    return str(len(sum([[0] * 5000] * 5000, [])))


def where(expression: str) -> str:
    """Where the call ran: its user id, and whether the test's secret is in its environment."""
    return f"uid={os.getuid()} secret={'AGENTENV_TEST_SECRET' in os.environ}"


def clock(expression: str) -> str:
    """Sleeps `expression` seconds; returns when it started and ended (the wall clock)."""
    started = time.time()
    time.sleep(float(expression))
    return f"{started} {time.time()}"
