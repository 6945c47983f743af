"""Environment construction, supported spaces and observation/reward normalization.

Importing this package registers the built-in pixel game `agentenv_jax/Catch-v0` and
`agentenv_jax/MinAtar-<Game>-v1` (MinAtar itself is imported only when one is made).
"""

from agentenv_jax.envs import catch, minatar
from agentenv_jax.envs.factory import (
    EnvError,
    EnvSpaces,
    autoreset_mode,
    describe_spaces,
    make_vector_env,
    resolve_env_factory,
)

catch.register()
minatar.register_minatar()

__all__ = [
    "EnvError",
    "EnvSpaces",
    "autoreset_mode",
    "describe_spaces",
    "make_vector_env",
    "resolve_env_factory",
]
