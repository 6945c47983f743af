"""Compile a learner's update on a background thread while the run gets going.

The update is the largest XLA program of a run (about a second to compile on CPU for the PPO
MLP), and nothing before the first update needs it: the learner can initialize parameters, the
env ranks (or the in-process actor) can build their envs and collect the first rollout, while
XLA compiles. Only the shapes of the arguments are needed to compile, and they are known at
construction. XLA's compiler releases the GIL, so the compile runs beside the Python work of
start-up on another core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class CompiledAhead:
    """`jitted` lowered and compiled for `abstract_args` (pytrees of `jax.ShapeDtypeStruct`) on
    a thread started now; calling this object waits for the compile (re-raising its error) and
    runs the compiled program. Calls must have exactly the compiled shapes and dtypes.
    """

    def __init__(self, jitted: Any, *abstract_args: Any, name: str = "update"):
        self._compiled: Callable[..., Any] | None = None
        self._error: BaseException | None = None
        # Not a daemon: a process that ends before its first update (a start-up error on
        # another rank, say) waits for the compile at exit; tearing the interpreter down under
        # a running XLA compile aborts the process ("terminate called ...").
        self._thread: threading.Thread | None = threading.Thread(
            target=self._compile, args=(jitted, abstract_args), name=f"compile-{name}"
        )
        self._thread.start()

    def _compile(self, jitted: Any, abstract_args: tuple[Any, ...]) -> None:
        try:
            self._compiled = jitted.lower(*abstract_args).compile()
        except BaseException as error:  # handed to the caller on its first call
            self._error = error

    def wait(self) -> Callable[..., Any]:
        """The compiled program, once the compile has finished."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        assert self._compiled is not None
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        return self.wait()(*args)
