"""Environment construction, supported spaces and observation/reward normalization."""

from agentenv_jax.envs.factory import (
    EnvError,
    EnvSpaces,
    autoreset_mode,
    describe_spaces,
    make_vector_env,
    resolve_env_factory,
)

__all__ = [
    "EnvError",
    "EnvSpaces",
    "autoreset_mode",
    "describe_spaces",
    "make_vector_env",
    "resolve_env_factory",
]
